# Two commands do everything on a fresh machine:
#   make reproduce   set up .venv, then run the whole Snakemake DAG on config/config.yaml
#   make test        set up .venv, then run the test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
CORES  ?= all
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: setup reproduce test test-fast dry-run report clean femnist-sample-fedgsp femnist-sample-fedcg

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,slurm]' -c constraints.txt
	touch $(STAMP)

setup: $(STAMP)

reproduce: setup
	$(BIN)/snakemake --cores $(CORES) --configfile config/config.yaml

# The real-writer studies (embedded FEMNIST sample; hours on a CPU, resumable: run again to continue)
femnist-sample-fedgsp femnist-sample-fedcg: setup
	$(BIN)/snakemake --cores $(CORES) --configfile config/$@.yaml

dry-run: setup
	$(BIN)/snakemake -n --cores $(CORES) --configfile config/config.yaml

report: setup
	$(BIN)/snakemake --cores 1 --configfile config/config.yaml --report report.html

test: setup
	$(BIN)/python -m pytest -q

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

clean:
	rm -rf results logs .snakemake mlflow.db mlflow.db.*.lock mlartifacts report.html
