#!/usr/bin/env bash
# Stops what slurm-up.sh started, by pidfile (STATE), waiting for each to exit.
STATE=${STATE:-}
scancel --user=root >/dev/null 2>&1 || true
pids=()
for f in "$STATE"/slurmd-node*.pid "$STATE"/slurmctld.pid "$STATE"/munged.pid; do
    [ -n "$STATE" ] && [ -s "$f" ] || continue
    p=$(cat "$f")
    kill "$p" 2>/dev/null && pids+=("$p")
done
for p in "${pids[@]}"; do
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
done
rm -f /etc/slurm/plugstack.conf.d/plait.conf "$STATE"/*.pid
exit 0
