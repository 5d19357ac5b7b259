"""Issue 55: how far the new causal forward moves from the old one where the algorithm is
kept - the plain pivot loop (the same draws), inference at long lengths, where the fused
local part, the float32 key side (``key_precision``) and the block-by-block merge sum in
another order. The old forward is the frozen copy ``tests/causal_v1.py``.

    OMP_NUM_THREADS=1 python scripts/causal_movement_check.py   # ~1 min, prints JSON rows
"""

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import causal_v1  # noqa: E402

from rpka.attention.causal import causal_forward, scaled  # noqa: E402
from rpka.attention.causal_landmarks import LandmarkSampler  # noqa: E402

CASES = [  # (n, block, rank, key_precision)
    (4096, 64, 64, "auto"),
    (4096, 64, 64, "float64"),
    (4096, 64, 16, "auto"),
    (8192, 64, 64, "auto"),
    (4096, 16, 32, "auto"),
]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def main() -> None:
    torch.set_num_threads(1)
    for n, block, rank, key_precision in CASES:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 8, n, 64, generator=g) for _ in range(3))

        def sampler(rank: int = rank) -> LandmarkSampler:
            return LandmarkSampler(
                rank, "rpc", "joint", "gauss", 0.5, torch.Generator().manual_seed(0)
            )

        with torch.no_grad():
            new = causal_forward(*scaled(q, k, v), block, sampler(), 1e-6, key_precision)[0]
            old = causal_v1.causal_forward(*scaled(q, k, v), block, sampler(), 1e-6)[0]
            exact = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        row = {
            "n": n,
            "block": block,
            "rank": rank,
            "key_precision": key_precision,
            "max_abs_new_vs_old": (new - old).abs().max().item(),
            "rel_new_vs_old": rel(new, old),
            "rel_err_vs_exact_old": rel(old, exact),
            "rel_err_vs_exact_new": rel(new, exact),
        }
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
