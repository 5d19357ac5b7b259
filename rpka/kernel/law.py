"""The rank a head needs, as a law (issue 54; docs/rank_law.md, "Law v2").

Coreset bounds for softmax attention give about sqrt(d) e^rho / eps points, independent of
the sequence length n, where rho bounds the logits a query can tell apart: for keys centred
at their mean k_bar (softmax is invariant to a shift of every logit of a row, so only the
spread of the keys matters),

    |q_i . (k_j - k_bar)| / sqrt(d) <= ||q_i|| ||k_j - k_bar|| / sqrt(d) <= rho.

This module measures one head: the statistics that stand for rho (:func:`head_statistics`),
the relative output error of a landmark method on a rank ladder against exact SDPA with the
head's own v (:func:`ladder_errors`), the rank r_eps at which the error falls to eps, as the
interval the ladder brackets it in (:func:`r_eps_interval`); and :func:`predict_rank`, the
fitted law (its coefficients from ``rank_law.json``'s ``law_v2`` fit, written by
``python -m rpka rank-law fit-v2``).

The error is that of the bidirectional attention over the head's n queries and n keys (the
kernel the bounds are about), also on causal tracks: the mask is not applied.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from rpka.attention import METHOD_INFO, build, options_of
from rpka.io import read_json
from rpka.paths import resolve

EPSILONS = (0.1, 0.03, 0.01)  # the registered error levels
PIVOT_SEEDS = (0, 1, 2)  # the registered pivot seeds; the error at a rank is their mean
RHO_STATISTICS = ("rho_bound", "logit_range", "logit_std")  # the first is primary
KEY_RESIDUAL = 0.05  # keys' effective rank: at most 5 % of their centred energy left
# above this rank RPKA's accelerated sampler's rejection rounds stall (rpka.study.dropin)
PLAIN_PIVOTS_ABOVE = 64
PLANTED_NOISE = 0.3  # planted heads: cluster noise, relative to a unit centre
LAW_FILE = "data/results/full/rank_law/rank_law.json"  # where predict_rank's fit lives


def full_rank(method: str, n: int) -> int:
    """Landmarks that span every point: 2n joint points (RPKA, uniform), n keys (coreset)."""
    return n if METHOD_INFO[method].landmarks == "keys" else 2 * n


def rank_ladder(method: str, n: int) -> list[int]:
    """2, 4, 8, ... below the method's full rank, then the full rank (exact by Nystrom's
    identity), so every head's r_eps is bracketed."""
    top = full_rank(method, n)
    return [2**i for i in range(1, 64) if 2**i < top] + [top]


def effective_rank(values: Tensor, residual: float = KEY_RESIDUAL) -> int:
    """The smallest r whose tail ``sum(values[r:]) / sum(values)`` is at most ``residual``:
    values descending and non-negative (eigenvalues, or squared singular values)."""
    tail = values.flip(0).cumsum(0).flip(0) / values.sum()
    below = (tail <= residual).nonzero()
    return int(below[0]) if len(below) else len(values)


def head_statistics(q: Tensor, k: Tensor) -> dict[str, float]:
    """The rho statistics of one head, the median over its items. q, k (B, n, d):

    * ``rho_bound`` (primary): max_i ||q_i|| * max_j ||k_j - k_bar|| / sqrt(d);
    * ``logit_range``: the median over rows of max_j s_ij - min_j s_ij, s = q k^T / sqrt(d);
    * ``logit_std``: the standard deviation of s;
    * ``key_rank``: the effective rank of the centred keys (:data:`KEY_RESIDUAL`).
    """
    q, k = q.double(), k.double()
    d = q.shape[-1]
    centred = k - k.mean(-2, keepdim=True)
    bound = q.norm(dim=-1).amax(-1) * centred.norm(dim=-1).amax(-1) / math.sqrt(d)
    logits = q @ k.transpose(-1, -2) / math.sqrt(d)  # (B, n, n)
    spread = (logits.amax(-1) - logits.amin(-1)).median(-1).values
    keys = [effective_rank(torch.linalg.svdvals(c).square()) for c in centred]
    return {
        "rho_bound": float(bound.median()),
        "logit_range": float(spread.median()),
        "logit_std": float(logits.flatten(1).std(-1).median()),
        "key_rank": float(np.median(keys)),
    }


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


def law_features(
    stats: dict[str, float],
    d: int,
    n: int,
    eps: float,
    p: int,
    terms: Sequence[str],
    statistic: str = "rho_bound",
) -> np.ndarray:
    """The law's regressors in the registered order: 1, rho (``statistic``, by default the
    primary one), log2 d, log2 n, log2(1/eps), log2 p - those of ``terms`` (a term that
    does not vary in the fit is left out)."""
    values = {
        "rho": stats[statistic],
        "log2_d": math.log2(d),
        "log2_n": math.log2(n),
        "log2_inv_eps": math.log2(1 / eps),
        "log2_p": math.log2(p),
    }
    return np.array([1.0, *(values[t] for t in terms)])


def load_fit(path: str | Path | None = None) -> dict[str, Any]:
    """The law v2's fit per method from ``rank_law.json`` (``law_v2.fit``)."""
    path = resolve(path or LAW_FILE)
    if not Path(path).exists():
        raise FileNotFoundError(
            f"{path} is missing: fit the law first (python -m rpka rank-law fit-v2)"
        )
    law = read_json(path).get("law_v2")
    if not law:
        raise ValueError(f"{path} has no law_v2 fit: run python -m rpka rank-law fit-v2")
    return law["fit"]


def predict_rank(
    q: Tensor,
    k: Tensor,
    v: Tensor | None = None,
    *,
    eps: float = 0.03,
    method: str = "rpka",
    causal: bool = False,
    p: int = 1,
    fit: dict[str, Any] | None = None,
) -> int:
    """The rank at which ``method`` approximates the attention of one head to a relative
    output error ``eps``, by the fitted law (docs/rank_law.md, "Law v2"): the law's median
    log2 r_eps at the head's rho statistics, rounded up to an integer and capped at the
    method's full rank.

    q, k: (n, d) or (B, n, d) for one head; v is not read (the law is fitted with each head's
    own v; it stands for a v of the scale trained heads have). ``causal``: the law is that
    of the bidirectional kernel, which the causal rows' prefixes never need more of (a row
    sees at most n keys), so the same rank is returned. ``p``: stored pairs (1 without).
    ``fit``: a fit per method (default :func:`load_fit`).
    """
    del v, causal  # documented above: the law reads neither
    if not 0 < eps < 1:
        raise ValueError(f"eps must lie in (0, 1), got {eps}")
    if q.dim() == 2:
        q, k = q.unsqueeze(0), k.unsqueeze(0)
    if q.dim() != 3 or k.shape[:-2] != q.shape[:-2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q, k must be (n, d) or (B, n, d) alike, got {q.shape}, {k.shape}")
    fits = fit if fit is not None else load_fit()
    if method not in fits or not fits[method].get("coef"):
        raise ValueError(f"method must be one of {sorted(fits)} (fitted), got {method!r}")
    law = fits[method]
    n, d = k.shape[-2], k.shape[-1]
    x = law_features(head_statistics(q, k), d, n, eps, p, law["terms"], law["statistic"])
    log2_rank = float(x @ np.asarray(law["coef"]))
    return int(min(full_rank(method, n), max(1, math.ceil(2 ** min(log2_rank, 62)))))
