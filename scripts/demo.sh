#!/usr/bin/env bash
# make demo: byte-level tokens from the bundled Shakespeare, then a small GPT
# trained on this machine's CPU for a few minutes, with samples before and
# after, metrics.jsonl and checkpoints in runs/demo, and its loss curve in
# runs/demo-loss.png.
set -euo pipefail
cd "$(dirname "$0")/.."
PLAIT=${PLAIT:-build/bin/plait}
mkdir -p runs/data
entropy=$("$PLAIT" data prepare examples/data/tinyshakespeare.txt runs/data/shakespeare_train.bin \
    --val runs/data/shakespeare_val.bin | tee /dev/stderr | sed -n 's/.*unigram entropy \([0-9.]*\).*/\1/p')
if [ -d runs/demo ]; then
    echo "plait: replacing the previous demo run in runs/demo"
    rm -rf runs/demo
fi
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
"$PLAIT" train examples/plans/shakespeare.json --out runs/demo "$@"
val=$(grep '"val_loss"' runs/demo/metrics.jsonl | tail -n 1 | sed 's/.*"val_loss": *\([-0-9.eE+]*\).*/\1/')
echo
echo "final validation loss: ${val:-?} nats/token; unigram entropy of the corpus: $entropy nats/token"
echo "run directory: runs/demo (metrics.jsonl, run.json, train.log, checkpoints/)"
# the curve next to the run directory (plait plot needs cairo: scripts/deps.sh build installs it)
if curve=$("$PLAIT" plot runs/demo -o runs/demo-loss.png); then
    echo "loss curve: $curve"
fi
