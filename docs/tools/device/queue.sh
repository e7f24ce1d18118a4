#!/bin/bash
# One call on a lent GPU machine (the device tool): the CUDA tests beside a queue of training jobs
# (JOBS/*.sh from jobs.py, in name order), CONC at a time, until all end or DEADLINE seconds have
# passed; then each finished run's small outputs come back in $OUT. From the repository root:
#
#   run(command="DEADLINE=540 bash docs/tools/device/queue.sh", carry=[".devrun", ".whl",
#       "data/femnist_sample"], timeout_s=595)
#
# then `python docs/tools/import_device_runs.py <unpacked runs.tgz> --device-name "<GPU>"`.
# What comes back (at most 8 files of 16 MiB): machine.txt, cuda_tests.log, runs.tgz (every finished
# run's metrics/history/predictions/assignments, state.pt where under 2 MB, the logs), and
# ckpt.tgz.part-* (the checkpoints of the runs the deadline stopped, to resume anywhere:
# `cat ckpt.tgz.part-* | tar xz` in the repository root). A clustered run's
# state.pt can be far larger (FedCG on the FEMNIST CNN: 356 MB) and stays there.
#
# Measured 2026-11-26 on an H200 (16 cores), 13 jobs at once under MPS: FedCG(4) on the 105 real
# writers, 300 rounds, in 450 s; a FeSEM paper-protocol baseline (250 rounds x 5 epochs) in 350-420 s.
set -u
T0=$(date +%s); DEADLINE=${DEADLINE:-540}; CONC=${CONC:-13}; JOBS=${JOBS:-.devrun/jobs}
export PYTHONUNBUFFERED=1
el() { echo $(( $(date +%s) - T0 )); }
[ -n "${SKIP_PIP:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target /tmp/site .whl/*.whl || { echo "pip failed"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD/src
mkdir -p .devrun/bin .devrun/logs
printf '#!/bin/sh\nexec python3 -m mcfl.cli "$@"\n' > .devrun/bin/mcfl; chmod +x .devrun/bin/mcfl
export PATH=$PWD/.devrun/bin:$PATH
{ nvidia-smi; nproc; python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"; } > $OUT/machine.txt 2>&1
# MPS lets the jobs' small kernels share the GPU instead of time-slicing it; off if it fails
if [ "${MPS:-1}" = 1 ] && command -v nvidia-cuda-mps-control >/dev/null; then
  nvidia-cuda-mps-control -d && if timeout 40 python3 -c "import torch; torch.ones(1, device='cuda').sum().item()"; then
    echo "MPS on" >> $OUT/machine.txt; else echo quit | nvidia-cuda-mps-control; echo "MPS failed, off" >> $OUT/machine.txt; fi
fi
echo "set up in $(el) s" >> $OUT/machine.txt
# CUDA_TESTS=0 leaves the CUDA tests out (a short call that only finishes runs)
[ "${CUDA_TESTS:-1}" = 0 ] && echo skipped > $OUT/cuda_tests.log ||
(timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py > $OUT/cuda_tests.log 2>&1; echo "rc=$? at $(el) s" >> $OUT/cuda_tests.log) &
TESTS=$!
PIDS=()
running() { local n=0; for p in "${PIDS[@]}"; do kill -0 $p 2>/dev/null && n=$((n+1)); done; echo $n; }
for j in $JOBS/*.sh; do
  while [ $(running) -ge $CONC ]; do sleep 1; [ $(el) -ge $DEADLINE ] && break 2; done
  n=$(basename $j .sh)
  ( s=$(el); bash $j > .devrun/logs/$n.out 2>&1; echo "$n rc=$? start=$s end=$(el)" >> .devrun/logs/done.txt ) &
  PIDS+=($!)
done
while [ $(running) -gt 0 ] && [ $(el) -lt $DEADLINE ]; do sleep 2; done
echo "stopped at $(el) s with $(running) running" >> .devrun/logs/done.txt
pkill -f "$JOBS/"; pkill -f "mcfl.cli"; sleep 3; pkill -9 -f "mcfl.cli"; kill $TESTS 2>/dev/null
find results*/ \( -path "*/runs/*" -o -path "*/logs/*" -o -path "*/init/*" \) -type f -size -2M > /tmp/small.txt
tar czf $OUT/runs.tgz .devrun/logs -T /tmp/small.txt
# Checkpoints of the runs the deadline stopped, the furthest-trained first (each one saves the
# rounds it holds; the log's last "N/R" says how many), as one tar split into 15 MiB parts
# (ckpt.tgz.part-aa, -ab, ...; `cat` them back together): a LEAF-CNN checkpoint is 26 MB, over one
# returned file's limit, and about two fit in what comes back.
JOBS=$JOBS python3 - <<'PY' >> $OUT/machine.txt 2>&1
import glob, os, re, subprocess
out = os.environ["OUT"]
budget = 60 * 2**20 - os.path.getsize(out + "/runs.tgz")        # 64 MiB back in all, 8 files
found = []
for job in sorted(glob.glob(os.environ["JOBS"] + "/*.sh")):
    text = open(job).read()
    ck, log = re.search(r"--checkpoint (\S+)", text), re.search(r"> (\S+) 2>&1", text)
    if not ck or not os.path.exists(ck.group(1)):
        continue
    done = 0
    if log and os.path.exists(log.group(1)):
        rounds = re.findall(r"(\d+)/\d+ \[", open(log.group(1), errors="replace").read()[-4000:])
        done = int(rounds[-1]) if rounds else 0
    found.append((-done, job, ck.group(1)))
picked, size = [], 0
for minus_done, _, path in sorted(found):
    s = os.path.getsize(path)
    if size + s > budget:
        print(f"no room to bring back: {path} ({s} bytes, {-minus_done} rounds trained)")
        continue
    picked.append(path); size += s
    print(f"checkpoint back: {path} ({-minus_done} rounds trained)")
if picked:
    subprocess.run(f"tar cf - {' '.join(picked)} | gzip -1 | split -b 15M - {out}/ckpt.tgz.part-",
                   shell=True, check=True)
PY
ls -la $OUT; cat .devrun/logs/done.txt; tail -3 $OUT/cuda_tests.log; echo "ended at $(el) s"
pkill -P $$; wait; exit 0
