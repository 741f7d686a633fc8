#!/usr/bin/env bash
# Writes the example manifests of k8s/examples/ with plait k8s render and admin
# (tests/integration/test_k8s.sh checks that they are what plait writes today).
# Usage: k8s/examples/regenerate.sh [PLAIT] [OUT_DIR]   (run from the repo root)
# The job examples read the store secret from the Secret shakespeare-store,
# which they do not hold: create it in the namespace first (k8s/ADMIN.md).
set -euo pipefail
plait=${1:-build/bin/plait}
out=${2:-k8s/examples}
job=(examples/plans/shakespeare.json --image registry.example.com/ml/plait:latest
    --nodes 2 --gpus-per-node 1 --gpu-product NVIDIA-A100-SXM4-40GB
    --name shakespeare --namespace ml --priority training-high --pvc plait-runs
    --set parallel.dp=auto --set data.train=/plait/data/shakespeare_train.bin
    --set data.val=/plait/data/shakespeare_val.bin)
"$plait" k8s render "${job[@]}" >"$out/job-jobset.yaml" 2>/dev/null
"$plait" k8s render "${job[@]}" --gang kueue --topology-key example.com/topology-rack \
    >"$out/job-kueue.yaml" 2>/dev/null
"$plait" k8s render "${job[@]}" --gang volcano >"$out/job-volcano.yaml" 2>/dev/null
"$plait" k8s render "${job[@]}" --gang volcano --workload vcjob >"$out/job-vcjob.yaml" 2>/dev/null
"$plait" k8s render "${job[@]}" --gang coscheduling >"$out/job-coscheduling.yaml" 2>/dev/null
"$plait" k8s admin --namespace ml --gpus 64 --cohort research \
    --gpu-product NVIDIA-A100-SXM4-40GB >"$out/admin-kueue.yaml"
"$plait" k8s admin --namespace ml --gpus 64 --gang volcano >"$out/admin-volcano.yaml"
"$plait" k8s admin --namespace ml --gpus 64 --gang quota >"$out/admin-quota.yaml"
