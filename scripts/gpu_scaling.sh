#!/usr/bin/env bash
# The GPU scaling run (issue 6): one H200, about 8 minutes of wall time in all.
#
#   OUT=/some/dir bash scripts/gpu_scaling.sh        # from the repository root
#
# Writes into $OUT (default data/results/scaling): env.txt, gpu_check.json (CUDA checks and
# a time breakdown, ~1 min) and gpu_h200.json (the sweep: forward first for every length,
# then forward+backward; the JSON is rewritten after every measurement and the sweep stops
# itself at its own time budget, so a timeout still leaves results). Extra arguments for
# `python -m rpka scaling` can be passed in SCALING_ARGS (e.g. "--lengths 4096 65536").
set -uo pipefail
OUT=${OUT:-data/results/scaling}
mkdir -p "$OUT"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python}

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  $PY -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  $PY -c "import triton; print('triton', triton.__version__)" 2>&1
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# 1. CUDA correctness checks + breakdown (hard limit 90 s)
timeout 90 $PY scripts/gpu_check.py "$OUT/gpu_check.json" || echo "gpu_check exited with $?"

# 2. the sweep: its own budget (--max-seconds, default 270 s) + a hard limit (330 s)
timeout 330 $PY -m rpka scaling --preset gpu --max-seconds "${SWEEP_SECONDS:-270}" \
  --out "$OUT/gpu_h200.json" ${SCALING_ARGS:-} || echo "scaling exited with $?"
ls -la "$OUT"
