"""CUDA checks and a time breakdown of RPKA before the GPU scaling sweep.

Writes ``$OUT/gpu_check.json`` (or argv[1]) after every step:

1. the fused Triton rejection sweep agrees with the PyTorch sweep on CUDA;
2. RPKA's no-grad fast path agrees with its differentiable path on CUDA (same pivots),
   and at full rank in float64 reproduces exact attention;
3. a breakdown at long n (B*H = 16, d = 64, bf16 inputs, r = 64): pivot selection alone,
   the whole forward, SDPA flash, with and without the Triton sweep (CUDA events).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch

from rpka.attention import build, triton_sweep
from rpka.attention.nystrom_chunked import nystrom_softmax_chunked
from rpka.attention.rpcholesky import gaussian_kernel
from rpka.attention.sweep import _sweep_torch
from rpka.io import write_json


def cuda_ms(fn, warmup: int = 3, repeats: int = 10) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def breakdown(n: int, g: torch.Generator, rank: int = 64) -> dict:
    """SDPA flash vs RPKA (whole forward, pivot selection alone, the chunked Nystrom pass)."""
    q, k, v = (
        torch.randn(1, 16, n, 64, generator=g, device="cuda").to(torch.bfloat16) for _ in range(3)
    )
    exact = build("exact", backend="flash", check_inputs=False)
    attn = build("rpka", rank=rank, check_inputs=False)
    row = {"n": n, "rank": rank}
    with torch.no_grad():
        row["sdpa_flash_ms"] = cuda_ms(lambda: exact(q, k, v))
        for fused in (True, False):
            tag = "triton" if fused else "torch_sweep"
            if not fused:
                os.environ["RPKA_DISABLE_TRITON"] = "1"
            row[f"forward_{tag}_ms"] = cuda_ms(lambda: attn(q, k, v))
            row[f"pivot_{tag}_ms"] = cuda_ms(lambda: attn.select(attn.point_set(q, k)))
            os.environ.pop("RPKA_DISABLE_TRITON", None)
        state = attn.select(attn.point_set(q, k))
        frame = attn._scaled(q, k)
        row["nystrom_chunked_ms"] = cuda_ms(
            lambda: nystrom_softmax_chunked(
                q, k, v, state, frame.q_scale, frame.k_scale, frame.key_shift, attn.den_floor
            )
        )
        row.update(rounds=state.rounds, candidates=state.candidates, refreshes=state.refreshes)
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        attn(q, k, v)
        torch.cuda.synchronize()
        row["rpka_peak_mib"] = (torch.cuda.max_memory_allocated() - before) / 2**20
        torch.cuda.reset_peak_memory_stats()
        exact(q, k, v)
        torch.cuda.synchronize()
        row["sdpa_peak_mib"] = (torch.cuda.max_memory_allocated() - before) / 2**20
    print(row, flush=True)
    return row


def main(out: str) -> None:
    report: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    report["triton"] = getattr(triton_sweep.triton, "__version__", None)
    t0 = time.perf_counter()
    dev = "cuda"

    # 1. fused sweep == PyTorch sweep
    g = torch.Generator(device=dev).manual_seed(0)
    sweep = {}
    for b in (8, 37, 64, 128):
        x = torch.randn(16, b, 8, generator=g, device=dev)
        x[:, 3] = x[:, 1]  # a duplicate: must be rejected
        gram = gaussian_kernel(x, x)
        thr = torch.rand(16, b, generator=g, device=dev) * 0.9
        a1, c1 = _sweep_torch(gram, thr)
        a2, c2 = triton_sweep.sweep(gram, thr)
        sweep[b] = {
            "accept_equal": bool(torch.equal(a1, a2)),
            "max_col_diff": float((c1 - c2).abs().max()),
        }
    report["sweep_triton_vs_torch"] = sweep
    report["triton_broken"] = triton_sweep._broken
    write_json(out, report)

    # 2. fast path == differentiable path; full rank float64 == exact
    q, k, v = (torch.randn(2, 4, 300, 32, generator=g, device=dev) for _ in range(3))
    outs = []
    for grad in (False, True):
        attn = build("rpka", rank=32, generator=torch.Generator(device=dev).manual_seed(1))
        xs = [x.clone().requires_grad_(grad) for x in (q, k, v)]
        outs.append(attn(*xs).detach())
    report["fast_vs_grad_max_diff"] = float((outs[0] - outs[1]).abs().max())
    q64, k64, v64 = (torch.randn(1, 2, 24, 8, generator=g, device=dev).double() for _ in range(3))
    full = build("rpka", rank=48)(q64, k64, v64)
    ref = build("exact", backend="math")(q64, k64, v64)
    report["full_rank_float64_rel_err"] = float((full - ref).norm() / ref.norm())
    write_json(out, report)

    # 3. breakdown at long n
    rows = []
    for n in (16384, 65536):
        rows.append(breakdown(n, g))
        report["breakdown"] = rows
        report["elapsed_s"] = time.perf_counter() - t0
        write_json(out, report)
    print(report)


if __name__ == "__main__":
    main(
        sys.argv[1]
        if len(sys.argv) > 1
        else os.path.join(os.environ.get("OUT", "."), "gpu_check.json")
    )
