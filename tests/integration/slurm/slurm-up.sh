#!/usr/bin/env bash
# Brings up a private Slurm cluster on this one machine for the tests: its own
# munged, slurmctld and NODES slurmd daemons (node1..), each with GPUS fake
# GPUs (char devices) and its own hostname, preemptable "low" and "high"
# partitions, and the plait SPANK plugin from the build tree in plugstack.conf.
#   SPANK_PLUGIN=path/to/spank_plait.so SPANK_ARGS="max_gpus_per_job=16 ..." \
#   STATE=/tmp/dir tests/integration/slurm/slurm-up.sh
# Everything lives under $STATE: configuration ($STATE/conf/slurm.conf, which
# clients reach through SLURM_CONF), munge key and socket, state, spool, logs,
# pid files, TmpFS and the fake GPUs. Nothing is written under /etc, /var,
# /run or /usr, and the ports are free ones picked here (not 6817/6818), so a
# real Slurm node is left alone. It refuses (exit 3) to run beside a slurmctld
# it did not start. slurm-down.sh stops what this started, by PID.
# Facts and pitfalls behind each line: ../shared/notes/slurm-lab.md.
set -euo pipefail
NODES=${NODES:-2}
CPUS=${CPUS:-4}
GPUS=${GPUS:-4}
MEM=${MEM:-8000}
STATE=${STATE:?set STATE to a scratch directory}
case $STATE in /*) ;; *) STATE=$PWD/$STATE ;; esac
CONF=$STATE/conf
export SLURM_CONF=$CONF/slurm.conf

# daemons of an earlier run with this STATE
"$(dirname "$0")/slurm-down.sh" >/dev/null 2>&1 || true

# beside a slurmctld this script did not start (a real cluster, another test
# run) the client commands could reach the wrong cluster: refuse
for p in $(pgrep -x slurmctld || true); do
    echo "slurm-up: refusing to start: a slurmctld this test did not start is running" \
        "(pid $p: $(tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null))" >&2
    exit 3
done

# munged wants every directory above its socket searchable by all (the
# caller makes STATE's parents so)
install -d -m 755 "$STATE"
install -d -m 755 "$CONF" "$STATE/munge" "$STATE/log" "$STATE/pid"
install -d -m 700 "$STATE/ctld"

# a private munged with its own key; AuthInfo points auth/munge and
# cred/munge (22.05: both read AuthInfo's socket=) at it
MUNGE_SOCKET=$STATE/munge/munge.socket
mungekey --create --force --keyfile="$STATE/munge/munge.key"
munged --socket="$MUNGE_SOCKET" --key-file="$STATE/munge/munge.key" \
    --pid-file="$STATE/pid/munged.pid" --log-file="$STATE/log/munged.log" \
    --seed-file="$STATE/munge/munged.seed"
for _ in $(seq 50); do
    munge -n --socket="$MUNGE_SOCKET" | unmunge --socket="$MUNGE_SOCKET" >/dev/null 2>&1 && break
    sleep 0.1
done

# ports: slurmctld at BASE, node n at BASE+n, a block below the kernel's
# ephemeral range that nothing listens on, so two runs do not collide
port_free() { ! ss -Htan | awk '{print $4}' | grep -qE ":$1\$"; }
BASE=
for _ in $(seq 100); do
    b=$((20000 + RANDOM % 10000))
    ok=1
    for k in $(seq 0 "$NODES"); do port_free $((b + k)) || { ok=0; break; }; done
    [ "$ok" = 1 ] && { BASE=$b; break; }
done
[ -n "$BASE" ] || { echo "slurm-up: no free ports in 20000-29999" >&2; exit 1; }

# fake GPUs: character devices (regular files make slurmd complain)
for n in $(seq 1 "$NODES"); do
    install -d "$STATE/dev/node$n" "$STATE/spool/node$n" "$STATE/tmp/node$n"
    for g in $(seq 0 $((GPUS - 1))); do
        mknod -m 666 "$STATE/dev/node$n/nvidia$g" c 195 $(((n - 1) * GPUS + g))
    done
done

{
    cat <<CONFEOF
ClusterName=plaittest
SlurmctldHost=localhost
SlurmctldPort=$BASE
SlurmdPort=$((BASE + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
MailProg=/bin/true
PlugStackConfig=$CONF/plugstack.conf
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/pid/slurmctld.pid
SlurmdPidFile=$STATE/pid/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
SlurmctldDebug=${SLURMCTLD_DEBUG:-info}
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=500
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
MpiDefault=none
TmpFS=$STATE/tmp/%n
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
GresTypes=gpu
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
JobRequeue=1
CONFEOF
    for n in $(seq 1 "$NODES"); do
        echo "NodeName=node$n NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((BASE + n)) CPUs=$CPUS RealMemory=$MEM Gres=gpu:$GPUS State=UNKNOWN"
    done
    echo "PartitionName=low Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=0"
    echo "PartitionName=high Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF"
} >"$CONF/slurm.conf"
# gres.conf is read from slurm.conf's directory
for n in $(seq 1 "$NODES"); do
    echo "NodeName=node$n Name=gpu File=$STATE/dev/node$n/nvidia[0-$((GPUS - 1))]"
done >"$CONF/gres.conf"
if [ -n "${SPANK_PLUGIN:-}" ]; then
    echo "required $SPANK_PLUGIN ${SPANK_ARGS:-}" >"$CONF/plugstack.conf"
else
    : >"$CONF/plugstack.conf"
fi

slurmctld -f "$SLURM_CONF"
for n in $(seq 1 "$NODES"); do
    # each node its own hostname (tasks inherit it)
    unshare --uts sh -c "hostname node$n; exec slurmd -f '$SLURM_CONF' -N node$n"
done
for _ in $(seq 150); do
    [ "$(sinfo -h -N -o '%N %T' 2>/dev/null | sort -u | grep -c ' idle$')" -ge "$NODES" ] && break
    sleep 0.2
done
if [ "$(sinfo -h -N -o '%N %T' | sort -u | grep -c ' idle$')" -lt "$NODES" ]; then
    sinfo -N
    tail -n 20 "$STATE"/log/slurmctld.log "$STATE"/log/slurmd-node*.log
    exit 1
fi
