"""Full-rank RPKA against exact attention as attention sharpens (issue 13, docs/numerics.md).

At full rank the Nystrom approximation is exact in exact arithmetic, so every error here is
numerics. Random q, k (B, H, n, d) are scaled so that the logits ``q.k / sqrt(d)`` have a
chosen standard deviation; the reference is a float64 softmax written here, not the
package's code. Cases: rpka non-causal (joint set, rank 2n, the chunked no-grad path and
the differentiable path), rpka causal (rank 2n, forward and prefill + steps),
keys-coreset (rank n), each in float32 and float64; plus keys repeated 4 times and a
"retrieval" case (each query a scaled copy of one earlier key). It records the relative
error ``|out - ref|_F / |ref|_F`` and the share of rows on which the denominator guard
fired, and (``--timing``) the CPU time of an rpka r=64 forward at n = 1024 and 4096.

Uses the public registry only (``build`` and ``guard_counts``), so it runs on older
commits too (that is how the "before" column of docs/numerics.md was made)::

    PYTHONPATH=. python scripts/sharp_attention_check.py --timing \
        --out data/results/sharp_attention.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from rpka.attention import build

STDS = (1.0, 2.25, 4.0, 8.0, 16.0, 36.0)
N, D, HEADS = 48, 16, 2


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v in float64, from the definition."""
    q, k, v = (x.double() for x in (q, k, v))
    logits = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        future = torch.ones(logits.shape[-2:], dtype=torch.bool).triu(1)
        logits = logits.masked_fill(future, float("-inf"))
    return torch.softmax(logits, -1) @ v


def random_qkv(std: float, seed: int, repeat: int = 1) -> tuple[torch.Tensor, ...]:
    """q, k, v (1, H, N, D) float64 with logit std ``std``; ``repeat`` > 1 repeats each key
    (and value) that many times in a row (near-duplicate / periodic tokens)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, HEADS, N, D, generator=g, dtype=torch.float64) for _ in range(3))
    if repeat > 1:
        k = k[..., : N // repeat, :].repeat_interleave(repeat, -2)
        v = v[..., : N // repeat, :].repeat_interleave(repeat, -2)
    return q * std**0.5, k * std**0.5, v


def retrieval_qkv(std: float, seed: int) -> tuple[torch.Tensor, ...]:
    """Each query is a scaled copy of one earlier key: one dominant key per row (sharp)."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(1, HEADS, N, D, generator=g, dtype=torch.float64)
    v = torch.randn(1, HEADS, N, D, generator=g, dtype=torch.float64)
    target = torch.randint(0, N, (N,), generator=g)
    target = torch.minimum(target, torch.arange(N))  # an earlier (or the same) position
    q = k[..., target, :] + 0.1 * torch.randn(1, HEADS, N, D, generator=g, dtype=torch.float64)
    return q * std**0.5, k * std**0.5, v


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).norm() / ref.norm())


def guard_share(method: torch.nn.Module) -> float:
    counts = method.guard_counts
    return counts.get("denominator", 0) / max(counts.get("rows", 0), 1)


def run_case(name: str, options: dict, qkv: tuple, dtype: torch.dtype, mode: str) -> dict:
    q, k, v = (x.to(dtype) for x in qkv)
    causal = bool(options.get("causal", False))
    if name != "exact":
        options = options | {"generator": torch.Generator().manual_seed(0)}
    method = build(name, **options)
    if mode == "grad":
        q = q.clone().requires_grad_(True)
        out = method(q, k, v).detach()
    elif mode == "decode":
        half = N // 2
        out, state = method.prefill(q[..., :half, :], k[..., :half, :], v[..., :half, :])
        outs = [out]
        for t in range(half, N):
            step = (x[..., t : t + 1, :] for x in (q, k, v))
            out, state = method.step(*step, state)
            outs.append(out)
        out = torch.cat(outs, -2)
    else:
        with torch.no_grad():
            out = method(q, k, v)
    ref = reference(q.detach(), k, v, causal)
    return {
        "error": relative_error(out, ref),
        "finite": bool(torch.isfinite(out).all()),
        "denominator_share": guard_share(method),
    }


CASES = {  # name -> (method, options, mode); exact: SDPA in the input dtype, the floor
    "exact": ("exact", {}, "no_grad"),
    "rpka": ("rpka", {"rank": 2 * N}, "no_grad"),
    "rpka_grad": ("rpka", {"rank": 2 * N}, "grad"),
    "rpka_causal": ("rpka", {"rank": 2 * N, "causal": True, "causal_block": 8}, "no_grad"),
    "rpka_decode": ("rpka", {"rank": 2 * N, "causal": True, "causal_block": 8}, "decode"),
    "rpka_causal_keys": (
        "rpka",
        {"rank": 2 * N, "causal": True, "causal_block": 8, "pivot_set": "keys"},
        "no_grad",
    ),
    "keys_coreset": ("keys-coreset", {"rank": N}, "no_grad"),
}
INPUTS = {"random": random_qkv, "repeated_keys": None, "retrieval": retrieval_qkv}


def accuracy() -> list[dict]:
    rows = []
    for input_name in INPUTS:
        for std in STDS:
            if input_name == "random":
                qkv = random_qkv(std, seed=0)
            elif input_name == "repeated_keys":
                qkv = random_qkv(std, seed=1, repeat=4)
            else:
                qkv = retrieval_qkv(std, seed=2)
            for case, (name, options, mode) in CASES.items():
                for dtype in (torch.float32, torch.float64):
                    result = run_case(name, options, qkv, dtype, mode)
                    rows.append(
                        {"input": input_name, "std": std, "case": case, "dtype": str(dtype)[6:]}
                        | result
                    )
    return rows


def timing(repeats: int = 15) -> list[dict]:
    """Wall time of an rpka r=64 forward (no grad, float32, B=1, H=4, d=32), one CPU
    thread, after a warm-up: min and median over ``repeats`` calls."""
    torch.set_num_threads(1)
    rows = []
    for n in (1024, 4096):
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 4, n, 32, generator=g) for _ in range(3))
        method = build("rpka", rank=64, generator=torch.Generator().manual_seed(0))
        times = []
        with torch.no_grad():
            method(q, k, v)  # warm-up
            for _ in range(repeats):
                start = time.perf_counter()
                method(q, k, v)
                times.append(time.perf_counter() - start)
        times.sort()
        rows.append({"n": n, "min_seconds": times[0], "median_seconds": times[len(times) // 2]})
    return rows


def write_json(path: Path, payload: dict) -> None:
    """Write to a temporary file, then rename (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f, indent=1)
    os.replace(tmp, path)


def markdown_table(before: list[dict], after: list[dict], input_name: str) -> str:
    """Before -> after relative error per case, dtype and logit std (docs/numerics.md)."""
    old = {(r["input"], r["std"], r["case"], r["dtype"]): r for r in before}
    stds = sorted({r["std"] for r in after})
    lines = [
        "| case | dtype | " + " | ".join(f"std {s:g}" for s in stds) + " |",
        "|---|---|" + "---|" * len(stds),
    ]
    for case in CASES:
        for dtype in ("float32", "float64"):
            cells = []
            for std in stds:
                new = next(
                    r
                    for r in after
                    if (r["input"], r["std"], r["case"], r["dtype"])
                    == (input_name, std, case, dtype)
                )
                was = old.get((input_name, std, case, dtype))
                floored = (
                    f" ({was['denominator_share']:.0%} floored)"
                    if was and was["denominator_share"] > 0.01
                    else ""
                )
                was_text = f"{was['error']:.0e}{floored} → " if was else ""
                cells.append(f"{was_text}{new['error']:.0e}")
            lines.append(f"| {case} | {dtype} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("data/results/sharp_attention.json"))
    parser.add_argument("--timing", action="store_true", help="also time an rpka forward")
    parser.add_argument(
        "--table",
        type=Path,
        nargs=2,
        metavar=("BEFORE", "AFTER"),
        help="print the markdown tables of two result files and exit (no computation)",
    )
    args = parser.parse_args()
    if args.table:
        before, after = (json.loads(p.read_text())["accuracy"] for p in args.table)
        for input_name in INPUTS:
            print(f"\n{input_name}:\n\n{markdown_table(before, after, input_name)}")
        return
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    payload = {"commit": commit, "n": N, "d": D, "heads": HEADS, "accuracy": accuracy()}
    if args.timing:
        payload["timing"] = timing()
    write_json(args.out, payload)
    for row in payload["accuracy"]:
        print(
            f"{row['input']:14s} std {row['std']:5.2f} {row['case']:13s} {row['dtype']:8s} "
            f"err {row['error']:.2e} floored {row['denominator_share']:.2f}"
        )
    for row in payload.get("timing", []):
        print(
            f"rpka r=64 forward n={row['n']}: min {row['min_seconds'] * 1e3:.1f} ms, "
            f"median {row['median_seconds'] * 1e3:.1f} ms"
        )


if __name__ == "__main__":
    main()
