#!/usr/bin/env bash
# Stops what slurm-up.sh started under $STATE: cancels the jobs of that cluster
# only (SLURM_CONF is its slurm.conf), then each daemon by the PID in its pid
# file, if that process is still the one started there (its command line
# names STATE), waiting for each to exit.
STATE=${STATE:?set STATE to the directory slurm-up.sh used}
case $STATE in /*) ;; *) STATE=$PWD/$STATE ;; esac
export SLURM_CONF=$STATE/conf/slurm.conf

# ours: the pid file's process, started with a path under STATE
ours() {
    local f=$1 p
    [ -s "$f" ] || return 1
    p=$(cat "$f")
    [[ $p =~ ^[0-9]+$ ]] || return 1
    tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null | grep -qF -- "$STATE/" || return 1
    echo "$p"
}

if ctld=$(ours "$STATE/pid/slurmctld.pid") && [ -f "$SLURM_CONF" ]; then
    scancel --user="$(id -un)" >/dev/null 2>&1 || true
    for _ in $(seq 50); do
        [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
        sleep 0.1
    done
fi
pids=()
for f in "$STATE"/pid/slurmd-*.pid "$STATE/pid/slurmctld.pid" "$STATE/pid/munged.pid"; do
    p=$(ours "$f") || continue
    kill "$p" 2>/dev/null && pids+=("$p")
done
for p in "${pids[@]}"; do
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$p" 2>/dev/null && kill -9 "$p" 2>/dev/null
done
rm -f "$STATE"/pid/*.pid
exit 0
