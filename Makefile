# The two commands of the README: `make run` and `make test`. Everything else is a helper.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test unit test-faults test-scale stop lint bench docs clean test-prereqs ai-gateway

$(STAMP): pyproject.toml constraints.txt clients/python/pyproject.toml
	./deploy/local/prereqs.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	$(BIN)/python -m pip install -q -c constraints.txt -e clients/python
	touch $(STAMP)

run: $(STAMP)  ## the local stack + every service in the background; prints URL and demo login
	$(BIN)/tollgate up

stop:  ## stop Tollgate and the local stack
	$(BIN)/tollgate down

lint: $(STAMP)
	$(BIN)/ruff check contracts services tests bench clients examples
	$(BIN)/mypy contracts services clients/python/src examples/ai-gateway/ai_gateway
	$(BIN)/lint-imports

test-prereqs:  ## what only the tests use: Debian chromium (the console's browser tests; Playwright's driver comes with the pip package), caddy (the ingress snippets) and prometheus (promtool and the alert rules' tests)
	./deploy/local/prereqs.sh --test

TEST_WORKERS ?= 2
test: $(STAMP) test-prereqs lint  ## lint, type-check, and the suite on real Kafka, Postgres, ClickHouse and redis (TEST_WORKERS processes; a module stays in one)
	$(BIN)/python -m pytest tests --ignore=tests/faults -p xdist.plugin -n $(TEST_WORKERS) --dist loadfile

unit: $(STAMP)  ## the unit tests alone (pure, no I/O): the edit-test loop, properties at a quarter of their examples
	$(BIN)/python -m pytest tests/unit -q --hypothesis-profile=quick

test-faults: $(STAMP)  ## the slow fault suite (brokers stopped, processes killed) on a stack of its own
	$(BIN)/python -m pytest tests/faults --ignore-glob='tests/faults/test_scale_*'

test-scale: $(STAMP)  ## the scaled-out shape under faults: three Kafka brokers, `up --split` behind nginx (its own stack)
	$(BIN)/python -m pytest tests/faults/test_scale_*.py

bench: $(STAMP)  ## every benchmark in bench/, each against its own baseline
	./deploy/local/prereqs.sh --bench
	@# the scripts only: helper modules (bench/stats.py, bench/support.py) have no __main__
	@for b in $$(grep -l '^if __name__ == "__main__":' bench/*.py); do echo "== $$b"; $(BIN)/python $$b || exit 1; done

ai-gateway: $(STAMP)  ## examples/ai-gateway on 127.0.0.1:9000 (needs TOLLGATE_SERVICE_TOKEN; examples/ai-gateway/README.md)
	cd examples/ai-gateway && ../../$(BIN)/python -m ai_gateway

docs: $(STAMP)
	$(BIN)/tollgate docs

clean: stop
	rm -rf .tollgate
