#!/usr/bin/env bash
# Every GPU measurement of the study in one run (the device time is short): the scaling
# sweep with its CUDA checks (scripts/gpu_scaling.sh), then the decoding benchmark with its
# causal checks (scripts/gpu_decode.sh). Each part has a hard time limit and writes its JSON
# incrementally into $OUT, so a timeout still leaves results.
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
echo "total: $(( $(date +%s) - start )) s"
