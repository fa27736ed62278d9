# zfab: `make run` starts a whole fabric locally; `make test` runs the suite.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PORT   ?= 8000
WORKERS ?= 2

.PHONY: run test lint docs docs-serve bench bench-quick bench-versus bench-forked bench-swap chaos norfab-suite clean

$(BIN)/.installed-run: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	touch $@

$(BIN)/.installed-dev: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@ $(BIN)/.installed-run $(BIN)/.installed-docs

run: $(BIN)/.installed-run
	$(BIN)/zfab up --workers $(WORKERS) --api-port $(PORT)

test: $(BIN)/.installed-dev
	$(BIN)/python -m pytest -q

lint: $(BIN)/.installed-dev
	$(BIN)/ruff check service api apiclient tests bench
	$(BIN)/ruff format --check service api apiclient
	bash tools/typecheck-tree.sh
	$(BIN)/mypy

# The documentation site (mkdocs.yml), offline and strict: a warning, a broken link or an anchor that is
# not there fails it. The reference pages are generated from the code as it builds (tools/docs/).
$(BIN)/.installed-docs: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[docs]'
	touch $@

docs: $(BIN)/.installed-docs
	bash tools/typecheck-tree.sh
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --clean --site-dir site

docs-serve: $(BIN)/.installed-docs
	bash tools/typecheck-tree.sh
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict --dev-addr 127.0.0.1:8001

# NorFab 0.25's own test suite on NorFab's broker, then on zfab's (tests/interop/norfab_suite/run.py):
# fails when a test passing on NorFab's broker fails on zfab's, or zfab's run takes over 1.5x as long
norfab-suite: $(BIN)/.installed-dev
	mkdir -p build
	$(BIN)/python tests/interop/norfab_suite/run.py --report build/norfab-suite.json

bench: $(BIN)/.installed-dev
	$(BIN)/python -m bench.run

bench-quick: $(BIN)/.installed-dev
	$(BIN)/python -m bench.run --quick

# zfab beside nfp_floor and floor.py only: three interleaved rounds, a burn-down of 100,000 queued
# jobs and a 1 ms injected-latency round (bench/versus.py; `--rounds 5 --n 50000` etc. by hand)
bench-versus: $(BIN)/.installed-dev
	$(BIN)/python -m bench.versus

# The sequential p50 of nfp_floor and zfab, their broker and worker forked from the measuring process or
# started as programs, 5 interleaved rounds (bench/forked.py; about 2 minutes)
bench-forked: $(BIN)/.installed-dev
	$(BIN)/python -m bench.forked

# Where zfab's sequential p50 goes: each role in turn swapped for nfp_floor's, or for a lean one keeping zfab's
# per-job promises; 3 interleaved rounds (bench/swap.py)
bench-swap: $(BIN)/.installed-dev
	$(BIN)/python -m bench.swap

# The soak of issue 39: jobs through the API with random worker kills and one broker and one API
# kill, every job audited against the task's own count (bench/chaos.py; CHAOS_JOBS=2000 for a short one).
CHAOS_JOBS ?= 20000
chaos: $(BIN)/.installed-dev
	$(BIN)/python -m bench.chaos --jobs $(CHAOS_JOBS)

clean:
	rm -rf $(VENV) build site *.egg-info .mypy_cache .ruff_cache .pytest_cache
