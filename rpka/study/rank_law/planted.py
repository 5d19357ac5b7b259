"""The planted positive control (issue 41, item 6): a case where RPKA is exact attention
below full rank, through the pivot-and-solve path.

Queries and keys drawn from ``p`` distinct vectors each (n = 256 tokens, many exact
duplicates): the Gaussian kernel over the joint points has rank at most 2p, so RPCholesky
at rank 2p pivots on every distinct point (a chosen point's residual is 0, so it is never
drawn again) and the Nystrom estimate equals softmax attention up to round-off - far below
the full rank 2n at which RPKA is exact without a draw (Nystrom's identity). Uniform
landmarks at the same rank re-draw duplicates and miss points: the negative control, which
must lose, so the positive one could have failed. The reference is torch SDPA.

    python -m rpka rank-law planted      # <results>/planted.json
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from rpka.attention import build
from rpka.io import write_result_json

PLANTED_FILE = "planted.json"
DISTINCT = (4, 8, 16)  # distinct query and key vectors: the kernel's rank is at most 2p
TOKENS, HEAD_DIM = 256, 16
POSITIVE, NEGATIVE = "rpka", "nystrom-uniform"
# exact "to round-off": the relative error RPKA must stay below, per dtype
TOLERANCE = {"float64": 1e-12, "float32": 1e-5}
NEGATIVE_MIN_ERROR = 1e-2  # the negative control must miss by at least this much


def planted_inputs(distinct: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """q, k (1, 1, n, d) drawn from ``distinct`` vectors each; v (1, 1, n, d) free."""
    g = torch.Generator().manual_seed(distinct)
    pool_q, pool_k = (torch.randn(distinct, HEAD_DIM, generator=g, dtype=dtype) for _ in "qk")
    q = pool_q[torch.randint(distinct, (TOKENS,), generator=g)][None, None]
    k = pool_k[torch.randint(distinct, (TOKENS,), generator=g)][None, None]
    v = torch.randn(1, 1, TOKENS, HEAD_DIM, generator=g, dtype=dtype)
    return q, k, v


def relative_error(method: str, distinct: int, dtype: torch.dtype) -> float:
    """|method - SDPA| / |SDPA| at rank 2 * ``distinct`` on the planted inputs."""
    q, k, v = planted_inputs(distinct, dtype)
    exact = F.scaled_dot_product_attention(q, k, v)
    attn = build(method, rank=2 * distinct, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = attn(q, k, v)
    return float((out - exact).norm() / exact.norm())


def planted_control(distinct: tuple[int, ...] = DISTINCT) -> dict[str, Any]:
    """Both controls at every ``distinct`` and dtype: rows of relative errors; ``passed`` -
    RPKA within :data:`TOLERANCE` everywhere; ``negative_misses`` - the readings where
    uniform landmarks are off by more than :data:`NEGATIVE_MIN_ERROR` (their 2p draws can
    cover every distinct point by luck, so not every reading need miss; ``could_fail``:
    at least one did, so the same rank can fail)."""
    rows = []
    for p in distinct:
        for name, tolerance in TOLERANCE.items():
            for method in (POSITIVE, NEGATIVE):
                error = relative_error(method, p, getattr(torch, name))
                rows.append({"method": method, "distinct": p, "rank": 2 * p, "dtype": name,
                             "relative_error": error, "exact": error < tolerance})  # fmt: skip
    negative = [r for r in rows if r["method"] == NEGATIVE]
    misses = sum(r["relative_error"] > NEGATIVE_MIN_ERROR for r in negative)
    return {
        "what": __doc__.split("\n\n")[0],
        "tokens": TOKENS, "head_dim": HEAD_DIM, "full_rank": 2 * TOKENS,
        "tolerance": TOLERANCE, "negative_min_error": NEGATIVE_MIN_ERROR, "rows": rows,
        "passed": all(r["exact"] for r in rows if r["method"] == POSITIVE),
        "negative_misses": misses, "negative_readings": len(negative), "could_fail": misses > 0,
    }  # fmt: skip


def write_planted(results: str | Path) -> dict[str, Any]:
    """:func:`planted_control` written to ``<results>/planted.json``."""
    result = planted_control()
    write_result_json(Path(results) / PLANTED_FILE, result)
    return result
