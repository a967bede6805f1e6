"""Pure-Python core of pdserve: never imports torch (tests/core/test_no_torch.py checks it)."""
