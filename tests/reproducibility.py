"""The reproducibility reference: numbers the suite recomputes bit for bit (issue 38).

Every attention method's output and gradients on fixed inputs (non-causal and causal),
and a smoke bench's per-seed scores (sweep and evaluation runs, one epoch). Under the
pinned CPU numerics (``rpka.numerics``) they are the same on any AVX2 x86 CPU of one vendor
with the project's torch wheel; the reference holds one entry per CPU vendor, since MKL's
pinned branch is the AVX2 one on Intel and the COMPATIBLE one elsewhere
(``rpka.numerics.pinned_environment``). ``tests/test_reproducibility.py`` fails when one
moves and names the likely cause.

    .venv/bin/python tests/reproducibility.py --write   # this vendor's entry, after an
                                                        # intended change only
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
from pathlib import Path
from typing import Any

from rpka import numerics

numerics.pin()  # as a script too: the reference is computed with pinned numerics

import torch  # noqa: E402

from rpka.attention import build  # noqa: E402
from rpka.bench import InProcessExecutor, run_bench  # noqa: E402
from rpka.config.presets import get_preset  # noqa: E402
from rpka.io import read_json, read_run_file, write_json  # noqa: E402

REFERENCE = Path(__file__).parent / "data" / "reproducibility.json"

# (method, options) pairs: each method once at a rank below n (its estimator, not the
# full-rank identity), RPKA also causal; float32 as the study trains
ATTENTION_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "exact": ("exact", {}),
    "exact-causal": ("exact", {"causal": True}),
    "rpka-r16": ("rpka", {"rank": 16}),
    "rpka-r16-causal": ("rpka", {"rank": 16, "causal": True, "causal_block": 16}),
    "nystrom-uniform-r16": ("nystrom-uniform", {"rank": 16}),
    "keys-coreset-r16": ("keys-coreset", {"rank": 16}),
    "nystromformer-r16": ("nystromformer", {"rank": 16}),
    "performer-r16": ("performer", {"rank": 16}),
    "local-w8": ("local", {"window": 8}),
}
SHAPE = (2, 2, 64, 16)  # (B, H, n, d)


def digest(tensor: torch.Tensor) -> dict[str, Any]:
    """sha256 of ``tensor``'s bytes (bit-exact identity) and three values to read."""
    flat = tensor.detach().contiguous().reshape(-1)
    return {
        "sha256": hashlib.sha256(flat.numpy().tobytes()).hexdigest(),
        "first": [float(x) for x in flat[:3]],
    }


def attention_case(name: str) -> dict[str, Any]:
    """Case ``name``'s output and the gradients of q, k, v of ``(out * w).sum()``."""
    method, options = ATTENTION_CASES[name]
    gen = torch.Generator().manual_seed(0)
    q, k, v, w = (torch.randn(SHAPE, generator=gen) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    torch.manual_seed(1)  # the methods that draw (pivots, uniform landmarks, features)
    out = build(method, **options)(q, k, v)
    (out * w).sum().backward()
    grads = {f"grad_{x}": digest(t.grad) for x, t in zip("qkv", (q, k, v), strict=True)}
    return {"out": digest(out), **grads}


def bench_reference() -> dict[str, Any]:
    """A one-epoch smoke bench's per-seed scores, run by run (sweep and evaluation)."""
    preset = get_preset(
        "smoke", train={"epochs": 1}, mechanism=None, output_error_ranks=(), n_workers=1
    )
    with tempfile.TemporaryDirectory() as root:
        run_bench(preset, Path(root) / "out", InProcessExecutor(), progress=False,
                  data_dir=Path(root) / "cache")
        runs = [read_run_file(f) for f in sorted((Path(root) / "out" / "runs").glob("*.json"))]
    return {
        f"{run['arm']} lr={run['lr']} {run['split']}": run["scores"]
        for run in sorted(runs, key=lambda r: (r["arm"], r["lr"], r["split"]))
    }


def compute() -> dict[str, Any]:
    """The whole reference, with the numerics and torch version it was computed with."""
    return {
        "numerics": numerics.record(),
        "attention": {name: attention_case(name) for name in ATTENTION_CASES},
        "bench": bench_reference(),
    }


def vendor_entry(reference: dict[str, Any], vendor: str | None = None) -> dict[str, Any] | None:
    """The reference computed on this CPU vendor's pinned numerics (None: none recorded)."""
    return reference["by_vendor"].get(vendor or numerics.cpu_vendor())


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    torch.set_num_threads(1)
    stored = read_json(REFERENCE) if REFERENCE.exists() else {"by_vendor": {}}
    stored["by_vendor"][numerics.cpu_vendor()] = compute()
    write_json(REFERENCE, stored)
    print(f"wrote {REFERENCE} ({numerics.cpu_vendor()})")
