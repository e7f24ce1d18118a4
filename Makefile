# Two commands do everything on a fresh machine:
#   make reproduce   set up .venv, then run the whole Snakemake DAG on config/config.yaml (via dvc repro)
#   make test        set up .venv, then run the test suite
# and three for the documentation site (docs/, mkdocs.yml):
#   make docs        build it into site/ (MkDocs, strict: any warning fails)
#   make docs-check  open every built page in headless Chromium: pages load, figures render, links resolve
#   make docs-results  copy the DAG's tables and figures (results/, and each study's results-*/docs/)
#                      into docs/ and the README's table
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
CORES  ?= all
export PATH := $(abspath $(BIN)):$(PATH)
export NO_MKDOCS_2_WARNING := 1

.PHONY: setup reproduce test test-fast dry-run report clean femnist-sample femnist-sample-paper femnist-sample-authors femnist-sample-authors-switches \
	femnist-sample-tune femnist-sample-fedgsp femnist-sample-fedcg femnist-flic femnist-sample-variants femnist-sample-switches femnist-sample-h248 femnist-sample-precision femnist-sample-replication fesem-digits-variants docs docs-check docs-serve docs-results lock dvc-lock

# requirements.lock pins every package (torch included) to the tested set: `make` installs exactly
# that, with uv (about 36 s) or, where uv fails, pip (about 2 min 45 s); MCFL_INSTALLER=pip forces
# pip. `pip install -e .` alone installs from pyproject.toml's ranges and keeps a torch already there.
$(STAMP): pyproject.toml requirements.lock workflow/scripts/install_venv.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python workflow/scripts/install_venv.py $(BIN)/python
	touch $(STAMP)

setup: $(STAMP)

# `dvc repro`: Snakemake on the config params.yaml names (config/config.yaml as shipped), then
# dvc.lock records the code, config and outputs, so `dvc status dvc.yaml` is clean after it
# (docs/reproducing.md; the other configs' stages are pipelines/dvc.yaml's).
# `make dvc-lock` records the code's and config's hashes in dvc.lock without running anything
# (outputs keep the hashes last recorded): after a code change, before committing.
# workflow/scripts/reproduce.py runs `make setup`, then `dvc repro`, and writes what each took (and
# the jobs it ran) to logs/reproduce.json, which `make docs-results` shows in the README.
reproduce:
	MCFL_CORES=$(CORES) $(PYTHON) workflow/scripts/reproduce.py

dvc-lock: setup
	$(BIN)/python workflow/scripts/dvc_lock.py

# The studies beside `make reproduce` (the real-writer ones: hours on a CPU, resumable: run again to
# continue; a job killed mid-run resumes from its checkpoint, hence --rerun-incomplete; after a killed
# Snakemake, `.venv/bin/snakemake --unlock --configfile ...` first: docs/reliability.md). Each is one
# config file: config/femnist-sample.yaml (FeSEM's Table 2 on the embedded writers), one of
# config/femnist-sample/ (each extends it), or fesem-digits-variants.yaml. The precision study takes
# its precision as a parameter: make femnist-sample-precision PRECISION=tf32 (bf16 unless given).
SNAKE_STUDY := $(BIN)/snakemake --cores $(CORES) --rerun-incomplete --configfile
FEMNIST_OVERLAYS := paper authors authors-switches tune fedgsp fedcg variants switches h248 replication
PRECISION ?= bf16

femnist-sample: setup
	$(SNAKE_STUDY) config/femnist-sample.yaml

$(FEMNIST_OVERLAYS:%=femnist-sample-%): femnist-sample-%: setup
	$(SNAKE_STUDY) config/femnist-sample/$*.yaml

femnist-sample-precision: setup
	$(SNAKE_STUDY) config/femnist-sample/precision.yaml --config 'vars={precision: $(PRECISION)}'

femnist-flic: setup
	$(SNAKE_STUDY) config/femnist-sample/flic.yaml

fesem-digits-variants: setup
	$(SNAKE_STUDY) config/fesem-digits-variants.yaml

dry-run: setup
	$(BIN)/snakemake -n --cores $(CORES) --configfile config/config.yaml

# The MLflow UI on the default config's runs (the store `make reproduce` writes), with nothing to
# activate: `make mlflow`, then open the URL the DAG's last line printed (or http://127.0.0.1:5000).
# Another store or port: make mlflow MLFLOW_STORE=sqlite:///other.db MLFLOW_PORT=5001
MLFLOW_STORE ?= sqlite:///mlflow.db
MLFLOW_PORT  ?= 5000
.PHONY: mlflow
mlflow: setup
	$(BIN)/mlflow ui --backend-store-uri $(MLFLOW_STORE) --port $(MLFLOW_PORT)

report: setup
	$(BIN)/snakemake --cores 1 --configfile config/config.yaml --report report.html

# The tests run on two workers (pytest-xdist, `--dist loadfile` from pyproject.toml: each test
# module stays on one worker, the longest first, tests/conftest.py); TEST_WORKERS=1 runs them in
# one process, as plain pytest.
TEST_WORKERS ?= 2
XDIST := $(if $(filter 1,$(TEST_WORKERS)),,-n $(TEST_WORKERS))

test: setup
	$(BIN)/python -m pytest -q --durations=25 $(XDIST)

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow" $(XDIST)

docs: setup
	$(BIN)/mkdocs build --strict --site-dir site

docs-check: docs
	$(BIN)/python docs/tools/docs_check.py site

docs-serve: setup
	$(BIN)/mkdocs serve

# After `make reproduce` (and any study): the DAG's tables and figures into docs/results/,
# docs/figures/ and the README's short table; each study's results-*/docs/ the same way
# (docs/tools/sync_results.py says what goes where).
docs-results: setup
	$(BIN)/python docs/tools/sync_results.py --results results
	test ! -d results/benchmarks || $(BIN)/python benchmarks/workflow_stages.py --results results \
	  --md docs/results/default-stages.md

# Regenerate requirements.lock from pyproject.toml, keeping every pin it already has unless a range
# excludes it (uv, installed into .venv on first use). Upgrade one package with UV_ARGS='-P name'.
lock: setup
	test -x $(BIN)/uv || $(BIN)/python -m pip install -q uv
	$(BIN)/uv pip compile pyproject.toml --extra dev --extra docs --extra slurm -o requirements.lock \
	  --python $(BIN)/python --no-emit-find-links --no-emit-index-url \
	  --custom-compile-command 'make lock' $(UV_ARGS)

# The rule files: formatted (snakefmt) and clean under `snakemake --lint` (see .ci/lint-snakemake);
# src/mcfl's imports: its layers (import-linter, pyproject.toml's [tool.importlinter]) and its import
# graph's depth, cycles and function-local imports (tools/import_graph.py)
.PHONY: lint
lint: setup
	$(BIN)/lint-imports
	$(BIN)/python tools/import_graph.py --check
	$(BIN)/snakefmt --check .
	.ci/lint-snakemake config/config.yaml config/femnist-sample/fedgsp.yaml config/femnist-sample/authors.yaml \
	  config/femnist-sample.yaml

clean:
	rm -rf results logs .snakemake mlflow.db mlflow.db.*.lock mlartifacts report.html site
