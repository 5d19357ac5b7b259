"""The rank a head needs, as a law (issue 54; docs/rank_law.md, "Law v2").

Coreset bounds for softmax attention give about sqrt(d) e^rho / eps points, independent of
the sequence length n, where rho bounds the logits a query can tell apart: for keys centred
at their mean k_bar (softmax is invariant to a shift of every logit of a row, so only the
spread of the keys matters),

    |q_i . (k_j - k_bar)| / sqrt(d) <= ||q_i|| ||k_j - k_bar|| / sqrt(d) <= rho.

This module measures one head: the relative output error of a landmark method on a rank
ladder against exact SDPA with the head's own v (:func:`ladder_errors`), the rank r_eps at
which the error falls to eps, as the interval the ladder brackets it in
(:func:`r_eps_interval`), and planted heads with a known rho (:func:`planted_head`). The
statistics that stand for rho (``head_statistics``) and the fitted law (``predict_rank``,
its coefficients from ``rank_law.json``'s ``law_v2`` fit, written by ``python -m rpka
rank-law fit-v2``) live in ``rpka.rank_law``, below the swap whose audit shows them; they are
re-exported here.

The error is that of the bidirectional attention over the head's n queries and n keys (the
kernel the bounds are about), also on causal tracks: the mask is not applied.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from rpka.attention import build, options_of
from rpka.rank_law import (  # noqa: F401 - re-exported: the law's predictor
    EPSILONS,
    KEY_RESIDUAL,
    LAW_FILE,
    RHO_STATISTICS,
    effective_rank,
    full_rank,
    head_statistics,
    law_features,
    load_fit,
    predict_rank,
)

PIVOT_SEEDS = (0, 1, 2)  # the registered pivot seeds; the error at a rank is their mean
# above this rank RPKA's accelerated sampler's rejection rounds stall (rpka.study.dropin)
PLAIN_PIVOTS_ABOVE = 64
PLANTED_NOISE = 0.3  # planted heads: cluster noise, relative to a unit centre


def rank_ladder(method: str, n: int) -> list[int]:
    """2, 4, 8, ... below the method's full rank, then the full rank (exact by Nystrom's
    identity), so every head's r_eps is bracketed."""
    top = full_rank(method, n)
    return [2**i for i in range(1, 64) if 2**i < top] + [top]


def _method(method: str, rank: int, seed: int) -> torch.nn.Module:
    """``method`` at ``rank`` with its own generator (RPKA's plain sampler above 64)."""
    options: dict[str, Any] = {"rank": rank}
    if "generator" in options_of(method):
        options["generator"] = torch.Generator().manual_seed(seed)
    if "pivot_method" in options_of(method) and rank > PLAIN_PIVOTS_ABOVE:
        options["pivot_method"] = "plain"
    return build(method, **options)


@torch.no_grad()
def ladder_errors(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    method: str,
    ranks: Sequence[int],
    seeds: Sequence[int] = PIVOT_SEEDS,
    stop_at: float | None = None,
) -> np.ndarray:
    """Relative Frobenius error ||out - exact||_F / ||exact||_F per rank, pivot seed and
    head, over the head's items, float64 (the approximation, not round-off). q, k, v
    (B, H, n, d) -> (R', seeds, H), R' = len(ranks) unless ``stop_at``: the ladder stops
    after the first rank where every head's error (mean over seeds) is at most it. The
    reference is torch SDPA on the same q, k, v."""
    q, k, v = (t.double() for t in (q, k, v))
    exact = F.scaled_dot_product_attention(q, k, v)
    norm = exact.square().sum((0, 2, 3)).sqrt()  # (H,)
    out = np.empty((len(ranks), len(seeds), q.shape[1]))
    for i, rank in enumerate(ranks):
        for j, seed in enumerate(seeds):
            approx = _method(method, rank, seed)(q, k, v)
            error = (approx - exact).square().sum((0, 2, 3)).sqrt() / norm
            out[i, j] = torch.nan_to_num(error, nan=math.inf).numpy()
        if stop_at is not None and (out[i].mean(0) <= stop_at).all():
            return out[: i + 1]
    return out


def r_eps_interval(ranks: Sequence[int], errors: np.ndarray, eps: float) -> tuple[int, float]:
    """The interval (lower, upper] the ladder brackets r_eps in: ``upper`` the first rank
    whose error (mean over pivot seeds) is at most ``eps``, ``lower`` the rung before (0 at
    the first); not reached on the ladder: (top rung, inf), right-censored. errors (R, seeds)."""
    mean = errors.mean(-1)
    hit = np.nonzero(mean <= eps)[0]
    if not len(hit):
        return int(ranks[-1]), math.inf
    first = int(hit[0])
    return (int(ranks[first - 1]) if first else 0), float(ranks[first])


def planted_head(
    rho: float, d: int, n: int, p: int, items: int = 2, seed: int = 0
) -> tuple[Tensor, Tensor, Tensor]:
    """Planted q, k, v (items, n, d) with ``rho_bound`` = rho exactly: keys in ``p``
    clusters (unit-norm centres, noise 0.3), centred and scaled to max ||k_j - k_bar|| = 1;
    queries pointing at the centres (noise 0.3) with max ||q_i|| = rho sqrt(d), so a query
    aligned with a key sees logits spread over about rho; v ~ N(0, 1). float64."""
    g = torch.Generator().manual_seed(seed)
    shape = (items, n, d)

    def unit(x: Tensor) -> Tensor:
        return x / x.norm(dim=-1, keepdim=True)

    centres = unit(torch.randn(items, p, d, generator=g, dtype=torch.float64))
    pick = torch.randint(p, (items, n), generator=g)
    k = centres.gather(1, pick[..., None].expand(shape))
    k = k + PLANTED_NOISE * torch.randn(shape, generator=g, dtype=torch.float64) / d**0.5
    k = k - k.mean(-2, keepdim=True)
    k = k / k.norm(dim=-1).amax(-1)[:, None, None]
    pick = torch.randint(p, (items, n), generator=g)
    noise = PLANTED_NOISE * torch.randn(shape, generator=g, dtype=torch.float64) / d**0.5
    q = unit(centres.gather(1, pick[..., None].expand(shape)) + noise)
    q = q * torch.rand(items, n, 1, generator=g, dtype=torch.float64).sqrt()  # norms vary
    q = q / q.norm(dim=-1).amax(-1)[:, None, None] * rho * d**0.5
    v = torch.randn(shape, generator=g, dtype=torch.float64)
    return q, k, v
