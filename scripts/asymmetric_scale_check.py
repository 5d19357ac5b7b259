"""Full-rank estimates against exact attention when queries and keys differ in scale.

At full rank a Nystrom estimate is exact in exact arithmetic, so every error here is
numerics. Random q, k, v (1, 2, n, d) ~ N(0, 1), q scaled by ``q x`` and k by ``k x``; the
reference is a float64 softmax written here, not the package's code. Methods: rpka (joint
set, rank 2n), rpka with keys-only pivots (rank n), nystrom-uniform (rank 2n),
keys-coreset (rank n), causal rpka (rank 2n, blocks of 16); the no-grad (chunked) path.
The table is the worst relative error ``|out - ref|_F / |ref|_F`` over 4 seeds, and
whether any warning was raised (``w``: the run said it is not exact, or a guard fired).

Uses the public registry only (``build``), so it runs on older commits too (that is how
the "before" column of docs/numerics.md was made)::

    PYTHONPATH=. python scripts/asymmetric_scale_check.py --out /tmp/after.json
    git worktree add /tmp/base <commit> && cp scripts/asymmetric_scale_check.py /tmp/base/scripts/
    (cd /tmp/base && PYTHONPATH=. python scripts/asymmetric_scale_check.py --out /tmp/before.json)
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import torch

# the float64 softmax written from the definition, shared with the sharp-attention check
# (scripts/ is on the path of a script run as `python scripts/...`)
from sharp_attention_check import reference

from rpka.attention import build

SCALES = ((3.2, 3.2), (5.0, 2.0), (10.0, 1.0), (1.0, 10.0), (20.0, 1.0), (1.0, 20.0),
          (3.0, 10.0), (10.0, 3.0), (10.0, 10.0), (20.0, 20.0))  # fmt: skip
METHODS = {  # label: (name, options, joint: rank 2n else n)
    "rpka": ("rpka", {}, True),
    "rpka keys": ("rpka", {"pivot_set": "keys"}, False),
    "nystrom-uniform": ("nystrom-uniform", {}, True),
    "keys-coreset": ("keys-coreset", {}, False),
    "causal rpka": ("rpka", {"causal": True, "causal_block": 16}, True),
}


def worst_error(label: str, q_x: float, k_x: float, n: int, d: int, dtype: torch.dtype) -> dict:
    """Worst relative error over 4 seeds, and whether any call warned."""
    name, options, joint = METHODS[label]
    worst, warned = 0.0, False
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(1, 2, n, d, generator=g, dtype=torch.float64) for _ in range(3))
        q, k = q * q_x, k * k_x
        method = build(
            name, rank=2 * n if joint else n, generator=torch.Generator().manual_seed(1), **options
        )
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            out = method(*(x.to(dtype) for x in (q, k, v)))
        ref = reference(q, k, v, options.get("causal", False))
        worst = max(worst, float((out.double() - ref).norm() / ref.norm()))
        warned = warned or any(issubclass(w.category, RuntimeWarning) for w in caught)
    return {"method": label, "q_x": q_x, "k_x": k_x, "n": n, "d": d,
            "dtype": str(dtype).split(".")[1], "rel_error": worst, "warned": warned}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [
        worst_error(label, q_x, k_x, n, d, dtype)
        for dtype, n, d in ((torch.float64, 64, 16), (torch.float32, 16, 8))
        for q_x, k_x in SCALES
        for label in METHODS
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"what": __doc__.split("\n\n")[0], "rows": rows}, indent=1))
    tmp.replace(args.out)
    for dtype in ("float64", "float32"):
        print(f"\n{dtype}: q x | k x | " + " | ".join(METHODS))
        for q_x, k_x in SCALES:
            cells = [
                f"{r['rel_error']:.0e}{' w' if r['warned'] else ''}"
                for r in rows
                if r["dtype"] == dtype and (r["q_x"], r["k_x"]) == (q_x, k_x)
            ]
            print(f"| x{q_x:g} | x{k_x:g} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
