#!/usr/bin/env bash
# Brings up a real Slurm cluster on this one machine for the tests: munged,
# slurmctld and NODES slurmd daemons (node1..), each with GPUS fake GPUs (char
# devices) and its own hostname, preemptable "low" and "high" partitions, and
# the plait SPANK plugin from the build tree in plugstack.conf.
#   SPANK_PLUGIN=path/to/spank_plait.so SPANK_ARGS="max_gpus_per_job=16 ..." \
#   STATE=/tmp/dir tests/integration/slurm/slurm-up.sh
# Everything it starts writes a pidfile under $STATE; slurm-down.sh stops them.
# Facts and pitfalls behind each line: ../shared/notes/slurm-lab.md.
set -euo pipefail
NODES=${NODES:-2}
CPUS=${CPUS:-4}
GPUS=${GPUS:-4}
MEM=${MEM:-8000}
STATE=${STATE:?set STATE to a scratch directory}
CONF=/etc/slurm

# no systemd here: keep package scripts from starting daemons
[ -e /usr/sbin/policy-rc.d ] || { printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; }

"$(dirname "$0")/slurm-down.sh" >/dev/null 2>&1 || true
mkdir -p "$STATE" /var/spool/slurmctld /var/log/slurm "$CONF/plugstack.conf.d"

# munge runs as user munge, with the key the Debian package created
[ -s /etc/munge/munge.key ] || { mungekey --create --force; chown munge:munge /etc/munge/munge.key; }
install -d -o munge -g munge -m 755 /run/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
    cp /run/munge/munged.pid "$STATE/munged.pid" # ours: slurm-down.sh stops it
fi
for _ in $(seq 50); do munge -n | unmunge >/dev/null 2>&1 && break; sleep 0.1; done

# fake GPUs: character devices (regular files make slurmd complain)
for n in $(seq 1 "$NODES"); do
    install -d "/run/fakegpu/node$n" "/var/spool/slurmd-node$n" "/tmp/slurm-node$n"
    for g in $(seq 0 $((GPUS - 1))); do
        [ -c "/run/fakegpu/node$n/nvidia$g" ] ||
            mknod -m 666 "/run/fakegpu/node$n/nvidia$g" c 195 $(((n - 1) * GPUS + g))
    done
done

{
    cat <<CONFEOF
ClusterName=plaittest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MailProg=/bin/true
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd-%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
SlurmctldDebug=info
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
MpiDefault=none
TmpFS=/tmp/slurm-%n
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
        echo "NodeName=node$n NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((17000 + n)) CPUs=$CPUS RealMemory=$MEM Gres=gpu:$GPUS State=UNKNOWN"
    done
    echo "PartitionName=low Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=0"
    echo "PartitionName=high Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF"
} >"$CONF/slurm.conf"
: >"$CONF/gres.conf"
for n in $(seq 1 "$NODES"); do
    echo "NodeName=node$n Name=gpu File=/run/fakegpu/node$n/nvidia[0-$((GPUS - 1))]" >>"$CONF/gres.conf"
done
echo "include $CONF/plugstack.conf.d/*.conf" >"$CONF/plugstack.conf"
rm -f "$CONF/plugstack.conf.d/plait.conf"
if [ -n "${SPANK_PLUGIN:-}" ]; then
    echo "required $SPANK_PLUGIN ${SPANK_ARGS:-}" >"$CONF/plugstack.conf.d/plait.conf"
fi

slurmctld -c # empty state: no jobs left from an earlier run
for n in $(seq 1 "$NODES"); do
    # each node its own hostname (tasks inherit it)
    unshare --uts sh -c "hostname node$n; exec slurmd -N node$n"
done
for _ in $(seq 150); do
    [ "$(sinfo -h -N -o '%N %T' 2>/dev/null | sort -u | grep -c ' idle$')" -ge "$NODES" ] && break
    sleep 0.2
done
if [ "$(sinfo -h -N -o '%N %T' | sort -u | grep -c ' idle$')" -lt "$NODES" ]; then
    sinfo -N
    tail -n 20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd-node*.log
    exit 1
fi
