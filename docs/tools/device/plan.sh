#!/bin/bash
# The next device call's job list: every study run not yet finished here, in priority order, as
# .devrun/jobs/NN-*.sh (jobs.py), ready for queue.sh. From the repository root:
#
#   bash docs/tools/device/plan.sh            # then: bash docs/tools/device/wheels.sh, and the run
#
# Priority (a 9-minute call runs 13 jobs at a time; what the deadline stops comes back as checkpoints
# that resume anywhere): first the real-writer Table-1 rows that are slowest on a CPU (NaiveGSP,
# NaiveGSP+ICG and FedGSP: 2.6 h a run there), then FedFusion and FedMMD with its chosen lam 0.01
# (about 2 h on a CPU since they train on the low-rank path), seed 0 before seeds 1 and 2; then that
# config's other missing runs; then the FedCG, standard and paper protocols' missing runs. The queue runs them in name order and stops at its deadline, so whatever does not fit
# waits for the next call.
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
dry config/femnist-sample-fedgsp.yaml .devrun/dry-1-fedgsp.txt
dry config/femnist-sample-fedcg.yaml .devrun/dry-2-fedcg.txt
dry config/femnist-sample.yaml .devrun/dry-3-standard.txt
dry config/femnist-sample-paper.yaml .devrun/dry-4-paper.txt
first=()
for s in 0 1 2; do
  for r in NaiveGSP NaiveGSP+ICG FedGSP FedFusion FedMMD; do
    [ -f "results-femnist-sample-fedgsp/runs/femnist_sample/$r/seed$s/metrics.json" ] \
      || first+=("results-femnist-sample-fedgsp-$r-s$s")
  done
done
python docs/tools/device/jobs.py .devrun/dry-[1-4]-*.txt --out .devrun/jobs ${first[@]+--first "${first[@]}"}
ls .devrun/jobs | head -20
