"""Shared test support (fakes, process helpers); importable because pytest adds tests/ to sys.path."""
