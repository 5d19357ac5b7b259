#!/usr/bin/env bash
# Decoding latency per token against context length on a GPU (docs/design.md section 7):
# exact attention with a KV cache (SDPA) against causal RPKA (rank 64, blocks of 64, joint
# pivots), contexts 1k .. 64k, B=1, H=16, d=64, bfloat16 inputs (RPKA computes in float32).
# Run from the repository root; writes $OUT/decode_cuda.json (default OUT=data/results/scaling).
# About a minute on an H200 (most of it the prefills and the Python start).
set -euo pipefail
OUT="${OUT:-data/results/scaling}"
PYTHON="${PYTHON:-python}"
PYTHONPATH=. "$PYTHON" scripts/gpu_causal_check.py
PYTHONPATH=. "$PYTHON" -m rpka decode --device cuda --dtype bfloat16 \
    --contexts 1024 2048 4096 8192 16384 32768 65536 \
    --out "$OUT/decode_cuda.json"
