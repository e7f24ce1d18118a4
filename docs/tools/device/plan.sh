#!/bin/bash
# The next device call's job list: every study run not yet finished here, in priority order, as
# .devrun/jobs/NN-*.sh (jobs.py), ready for queue.sh. From the repository root:
#
#   bash docs/tools/device/plan.sh            # then: bash docs/tools/device/wheels.sh, and the run
#
# Priority (a 9-minute call finishes about 13 runs of these sizes at 13 at a time): first one FedGSP
# run of the real-writer Table-1 config, to time it (never run on a GPU yet: 500 rounds, evaluated
# every round); then the FedCG ablations' seeds 1-2 and FedProx's seed 0; then the standard
# protocol's missing runs (issue 29's main table); then the paper protocol's seeds 1-2. The queue
# runs them in name order and stops at its deadline, so whatever does not fit waits for the next call.
set -eu
cd "$(dirname "$0")/../../.."
PATH="$PWD/.venv/bin:$PATH"          # snakemake and python of `make setup`
mkdir -p .devrun
grep -qx "/.devrun/" .git/info/exclude 2>/dev/null || echo "/.devrun/" >> .git/info/exclude
dry() {   # dry.txt of a config's missing runs (optionally only TARGETS)
  local cfg=$1 out=$2; shift 2
  snakemake "$@" -n -p --cores 1 --rerun-triggers mtime --configfile "$cfg" > "$out" 2>&1 \
    || { echo "dry run of $cfg failed: $out"; exit 1; }
  # centres that exist here but not on the device machine: the jobs make them again (seeded: same file)
  local need; need=$(python docs/tools/device/jobs.py "$out" --out .devrun/jobs --centres-needed)
  [ -z "$need" ] || snakemake $need -f -n -p --cores 1 --rerun-triggers mtime --configfile "$cfg" >> "$out" 2>&1
}
dry config/femnist-sample-fedgsp.yaml .devrun/dry-1-fedgsp.txt \
  results-femnist-sample-fedgsp/runs/femnist_sample/FedGSP/seed0/metrics.json
dry config/femnist-sample-fedcg.yaml .devrun/dry-2-fedcg.txt
dry config/femnist-sample.yaml .devrun/dry-3-standard.txt
dry config/femnist-sample-paper.yaml .devrun/dry-4-paper.txt
python docs/tools/device/jobs.py .devrun/dry-[1-4]-*.txt --out .devrun/jobs
ls .devrun/jobs | head -20
