PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Test processes: the suite spends ~40 % of a serial run waiting on service processes, so two
# workers fill a 2-core CI box; each test module stays on one worker (its stack starts once),
# modules with slow tests first (tests/conftest.py).
TEST_WORKERS ?= 2
STAMP := $(VENV)/.installed
PROTOS := $(wildcard protos/pdserve/v1/*.proto)

.PHONY: run test protos venv clean

run: $(STAMP)
	$(BIN)/pdserve up --demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -ra -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

protos: $(STAMP)
	$(BIN)/python -m pdserve.proto.generate

clean:
	rm -rf $(VENV) build *.egg-info
