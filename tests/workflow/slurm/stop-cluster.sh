#!/usr/bin/env bash
# Stop the test cluster started by start-cluster.sh (same STATE_DIR): cancel its jobs, stop slurmd
# and slurmctld by their pid files, and remove the state directory and the /etc/slurm files it wrote. munged is left running (other
# Slurm or munge users may share it); pass --munge to stop it too.
set -uo pipefail
STATE=${1:-/tmp/mcfl-slurm}
[ "${1:-}" = "--munge" ] && STATE=/tmp/mcfl-slurm
MARKER="# written by mcfl tests/slurm/start-cluster.sh"
OURS=0
grep -qxF "$MARKER" /etc/slurm/slurm.conf 2>/dev/null && OURS=1
[ $OURS = 1 ] && scancel --full --quiet -u "$(id -un)" 2>/dev/null
for d in slurmd slurmctld; do
    pidf=$STATE/run/$d.pid
    if [ -f "$pidf" ]; then
        pid=$(cat "$pidf")
        kill "$pid" 2>/dev/null
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null
    fi
done
if [[ " $* " == *" --munge "* ]] && [ -f /run/munge/munged.pid ]; then
    kill "$(cat /run/munge/munged.pid)" 2>/dev/null
fi
rm -rf "$STATE"
[ $OURS = 1 ] && rm -f /etc/slurm/slurm.conf /etc/slurm/gres.conf
exit 0
