"""Attention latency against sequence length and rank (DESIGN.md section 7).

Every method is timed in the same process on the same inputs, so the ratios against
``exact`` are within one run. CPU timing uses ``time.perf_counter``; CUDA timing uses
CUDA events after warm-up. The result is one JSON file.

    python -m rpka scaling --lengths 256 1024 4096 --ranks 16 64 --out data/results/scaling/cpu.json
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial

import torch
from tqdm.auto import tqdm

from rpka.attention import build
from rpka.io import write_json

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ScalingConfig:
    """One latency sweep: every (method, rank) at every length."""

    lengths: Sequence[int] = (256, 1024, 4096)
    ranks: Sequence[int] = (16, 64)
    batch_heads: int = 8
    head_dim: int = 64
    device: str = "cpu"
    dtype: str = "float32"
    warmup: int = 2
    repeats: int = 5
    seed: int = 0
    methods: Sequence[str] = field(default_factory=lambda: ("exact", "rpka"))

    def validate(self) -> None:
        if not self.lengths or any(int(n) < 2 for n in self.lengths):
            raise ValueError(f"lengths must be integers >= 2, got {list(self.lengths)}")
        if any(int(r) < 1 for r in self.ranks):
            raise ValueError(f"ranks must be positive integers, got {list(self.ranks)}")
        for name, value, low in (
            ("batch_heads", self.batch_heads, 1),
            ("head_dim", self.head_dim, 1),
            ("warmup", self.warmup, 0),
            ("repeats", self.repeats, 1),
        ):
            if int(value) < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' requested but CUDA is not available")


def time_call(fn: Callable[[], object], device: str, warmup: int, repeats: int) -> list[float]:
    """Wall time of ``fn`` in milliseconds, ``repeats`` times after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    return f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"


def run_scaling(config: ScalingConfig, progress: bool = True) -> dict:
    """Forward latency (median ms) of each method at each length; ratios vs exact."""
    config.validate()
    dtype = DTYPES[config.dtype]
    arms = [("exact", {})] + [
        (m, {"rank": int(r)}) for m in config.methods if m != "exact" for r in config.ranks
    ]
    rows = []
    jobs = [(n, arm) for n in config.lengths for arm in arms]
    gen = torch.Generator(device=config.device).manual_seed(config.seed)
    for n, (name, options) in tqdm(jobs, desc="scaling", disable=not progress):
        shape = (1, config.batch_heads, int(n), config.head_dim)
        q, k, v = (
            torch.randn(shape, generator=gen, device=config.device).to(dtype) for _ in range(3)
        )
        attn = build(name, check_inputs=False, **options).to(config.device)
        with torch.no_grad():
            times = time_call(partial(attn, q, k, v), config.device, config.warmup, config.repeats)
        rows.append(
            {
                "method": name,
                "rank": options.get("rank"),
                "n": int(n),
                "forward_ms": statistics.median(times),
                "forward_ms_all": times,
            }
        )
    exact_ms = {r["n"]: r["forward_ms"] for r in rows if r["method"] == "exact"}
    for r in rows:
        r["speedup_vs_exact"] = exact_ms[r["n"]] / r["forward_ms"]
    return {
        "config": asdict(config)
        | {
            "lengths": list(config.lengths),
            "ranks": list(config.ranks),
            "methods": list(config.methods),
        },
        "device": device_name(config.device),
        "torch": torch.__version__,
        "shape": f"B=1, H={config.batch_heads}, d={config.head_dim}, {config.dtype}",
        "rows": rows,
    }


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m rpka scaling",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    defaults = ScalingConfig()
    parser.add_argument("--lengths", type=int, nargs="+", default=list(defaults.lengths))
    parser.add_argument("--ranks", type=int, nargs="+", default=list(defaults.ranks))
    parser.add_argument("--batch-heads", type=int, default=defaults.batch_heads)
    parser.add_argument("--head-dim", type=int, default=defaults.head_dim)
    parser.add_argument("--device", default=defaults.device)
    parser.add_argument("--dtype", default=defaults.dtype)
    parser.add_argument("--warmup", type=int, default=defaults.warmup)
    parser.add_argument("--repeats", type=int, default=defaults.repeats)
    parser.add_argument("--out", default="data/results/scaling/latency_cpu.json")
    args = parser.parse_args(argv)
    config = ScalingConfig(
        lengths=args.lengths,
        ranks=args.ranks,
        batch_heads=args.batch_heads,
        head_dim=args.head_dim,
        device=args.device,
        dtype=args.dtype,
        warmup=args.warmup,
        repeats=args.repeats,
    )
    try:
        config.validate()
    except ValueError as err:
        parser.error(str(err))
    result = run_scaling(config)
    write_json(args.out, result)
    print(f"{'method':>8} {'rank':>5} {'n':>6} {'forward ms':>11} {'vs exact':>9}")
    for r in result["rows"]:
        print(
            f"{r['method']:>8} {r['rank'] or '-':>5} {r['n']:>6} {r['forward_ms']:>11.2f} "
            f"{r['speedup_vs_exact']:>8.2f}x"
        )
    print(f"device: {result['device']}; {result['shape']}; written to {args.out}")
    return result
