#!/bin/bash
# The next device call's job list: every study run not yet finished here, in priority order, as
# .devrun/jobs/NN-*.sh (jobs.py), ready for queue.sh. From the repository root:
#
#   bash docs/tools/device/plan.sh            # then: bash docs/tools/device/wheels.sh, and the run
#
# Priority: what a 9-minute call can finish. Measured 2026-11-27 on an H200, 14 jobs at once under
# MPS: the FedAvg-style rows' 500 rounds in 190-210 s, FedMMD in 250 s, FedFusion (2 jobs at once)
# 3 rounds/s, FedGSP 470 rounds in 536 s; NaiveGSP and NaiveGSP+ICG only 100 rounds (5.2 s a round:
# every round is one chain of 35 writers, 980 SGD steps one after another, which a GPU hardly
# speeds up), so those two rows are CPU jobs (about 25 s a round there) and come last. Seed 0 before
# seeds 1 and 2; then that config's other missing runs; then the FedCG, standard and paper
# protocols' missing runs. The queue runs them in name order and stops at its deadline; of the
# runs it stops, the furthest-trained come back as checkpoints (about two fit).
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
dry config/femnist-sample/fedgsp.yaml .devrun/dry-1-fedgsp.txt
dry config/femnist-sample/fedcg.yaml .devrun/dry-2-fedcg.txt
dry config/femnist-sample.yaml .devrun/dry-3-standard.txt
dry config/femnist-sample/paper.yaml .devrun/dry-4-paper.txt
G=results-femnist-sample-fedgsp
missing() { [ ! -f "$G/runs/femnist_sample/$1/seed$2/metrics.json" ] \
              && [ ! -f "docs/results/runs/$G/femnist_sample/$1/seed$2/metrics.json" ]; }
first=(); last=()
for s in 0 1 2; do
  for r in FedGSP FedFusion FedMMD; do missing $r $s && first+=("$G-$r-s$s"); done
  for r in NaiveGSP NaiveGSP+ICG; do missing $r $s && last+=("$G-$r-s$s"); done
done
python docs/tools/device/jobs.py .devrun/dry-[1-4]-*.txt --out .devrun/jobs \
  ${first[@]+--first "${first[@]}"} ${last[@]+--last "${last[@]}"}
ls .devrun/jobs | head -20
