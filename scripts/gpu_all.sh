#!/usr/bin/env bash
# Every GPU measurement of the study in one run (the device time is short): the scaling
# sweep with its CUDA checks (scripts/gpu_scaling.sh), the decoding benchmark with its
# causal checks (scripts/gpu_decode.sh), then the long-context model's training step at
# 2,048 and 8,192 tokens (scripts/bench_training_step.py: exact, rpka-r16, rpka-r64 with the
# inverse refresh the long-context study uses; training_step_cuda.json). Each part has a
# hard time limit; the first two write their JSON incrementally into $OUT, so a timeout
# still leaves results (the training step writes its file at the end: ~1 min expected).
#
#   OUT=/some/dir PYTHON=python3 bash scripts/gpu_all.sh
set -uo pipefail
export OUT=${OUT:-data/results/scaling}
export PYTHON=${PYTHON:-python3}
export SWEEP_SECONDS=${SWEEP_SECONDS:-230}
mkdir -p "$OUT"
start=$(date +%s)
bash scripts/gpu_scaling.sh 2>&1 | tee "$OUT/gpu_scaling.log" | tail -40
echo "scaling part: $(( $(date +%s) - start )) s"
timeout 120 bash scripts/gpu_decode.sh 2>&1 | tee "$OUT/gpu_decode.log" | tail -25
timeout 90 env PYTHONPATH=. "$PYTHON" scripts/bench_training_step.py --device cuda \
    --contexts 2048 8192 --arms exact rpka-r16 rpka-r64-inverse \
    --output "$OUT/training_step_cuda.json" 2>&1 | tee "$OUT/gpu_training_step.log" | tail -8
echo "total: $(( $(date +%s) - start )) s"
