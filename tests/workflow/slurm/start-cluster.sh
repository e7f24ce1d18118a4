#!/usr/bin/env bash
# A single-node Slurm cluster on localhost for the tests (Debian's slurm-wlm + munge; nothing else is
# contacted). Usage:  tests/workflow/slurm/start-cluster.sh [STATE_DIR]   (default /tmp/mcfl-slurm)
# Writes /etc/slurm/slurm.conf (one node, 2 CPUs, partition `cpu`; a `gpu` partition with a GRES entry
# only where nvidia-smi finds a GPU), starts munged, slurmctld and slurmd as daemons, and waits until
# `sinfo` shows the node idle. Stop with stop-cluster.sh.
# Accounting: no slurmdbd; job states come from `squeue` (MinJobAge=600 keeps finished jobs listed for
# 10 min), which snakemake-executor-plugin-slurm uses with `slurm-status-command: squeue`.
# Needs root (Slurm jobs run as root here) and no systemd.
# The config goes to Slurm's default path because the job step (snakemake-executor-plugin-slurm-jobstep)
# drops every SLURM_* variable, SLURM_CONF included, before its `srun`. An /etc/slurm/slurm.conf not
# written by this script (no MARKER line) is left alone and the script fails.
set -euo pipefail
STATE=${1:-/tmp/mcfl-slurm}
for b in munged slurmctld slurmd sinfo sbatch squeue; do
    command -v "$b" >/dev/null || { echo "start-cluster: $b not found (apt-get install slurm-wlm munge)" >&2; exit 2; }
done
MARKER="# written by mcfl tests/slurm/start-cluster.sh"
CONF=/etc/slurm/slurm.conf
if [ -e "$CONF" ] && ! grep -qxF "$MARKER" "$CONF"; then
    echo "start-cluster: $CONF exists and is not ours; not touching a real cluster's config" >&2; exit 3
fi
mkdir -p "$STATE"/{spool/ctld,spool/d,log,run} /etc/slurm
HOST=$(hostname -s)
CPUS=${MCFL_SLURM_CPUS:-2}
MEM=$(awk '/MemTotal/ {print int($2/1024*0.8)}' /proc/meminfo)

GPUS=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    GPUS=$(nvidia-smi -L | grep -c '^GPU')
fi
GRES_NODE=""; GRES_TYPES=""
if [ "$GPUS" -gt 0 ]; then
    GRES_NODE="Gres=gpu:$GPUS"; GRES_TYPES="GresTypes=gpu"
    : > /etc/slurm/gres.conf
    for i in $(seq 0 $((GPUS - 1))); do echo "NodeName=$HOST Name=gpu File=/dev/nvidia$i" >> /etc/slurm/gres.conf; done
fi

cat > "$CONF" <<CONF
$MARKER
# state: $STATE
ClusterName=mcfltest
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
SlurmctldPort=${MCFL_SLURM_PORT:-6817}
SlurmdPort=$(( ${MCFL_SLURM_PORT:-6817} + 1 ))
StateSaveLocation=$STATE/spool/ctld
SlurmdSpoolDir=$STATE/spool/d
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=600
KillWait=5
InactiveLimit=0
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
$GRES_TYPES
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM $GRES_NODE State=UNKNOWN
PartitionName=cpu Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
CONF
if [ "$GPUS" -gt 0 ]; then
    echo "PartitionName=gpu Nodes=$HOST MaxTime=INFINITE State=UP" >> "$CONF"
fi
export SLURM_CONF=$CONF

# munge: a key if there is none, and the daemon unless one answers already
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge
    if [ ! -s /etc/munge/munge.key ]; then
        if command -v mungekey >/dev/null; then mungekey --create --keyfile=/etc/munge/munge.key
        else dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none; fi
    fi
    chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
    chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key
    if id munge >/dev/null 2>&1; then
        runuser -u munge -- munged
    else
        munged --force
    fi
    for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
fi

slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"
for _ in $(seq 120); do
    state=$(sinfo -h -N -o '%t' 2>/dev/null | head -1 || true)
    if [ "$state" = "idle" ]; then
        echo "start-cluster: node $HOST idle ($CPUS CPUs, $GPUS GPUs); config $CONF, state $STATE"
        exit 0
    fi
    sleep 0.5
done
echo "start-cluster: node not idle after 60 s (state: ${state:-none}); logs in $STATE/log" >&2
tail -20 "$STATE/log/slurmctld.log" "$STATE/log/slurmd.log" >&2 || true
exit 1
