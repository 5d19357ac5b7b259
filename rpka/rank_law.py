"""The rank a head needs, by the fitted law (issue 54; docs/rank_law.md, "Law v2").

Coreset bounds for softmax attention give about sqrt(d) e^rho / eps points, independent of
the sequence length n, where rho bounds the logits a query can tell apart: for keys centred
at their mean k_bar (softmax is invariant to a shift of every logit of a row, so only the
spread of the keys matters),

    |q_i . (k_j - k_bar)| / sqrt(d) <= ||q_i|| ||k_j - k_bar|| / sqrt(d) <= rho.

This module is the law's predictor: the statistics of one head's q and k that stand for rho
(:func:`head_statistics`), the law's regressors (:func:`law_features`) and
:func:`predict_rank`, with its coefficients from ``rank_law.json``'s ``law_v2`` fit (written
by ``python -m rpka rank-law fit-v2``). It sits below ``rpka.swap`` so that the swap's audit
shows each call site's rho and predicted rank without loading the kernel studies (whose
import pins the CPU numerics, ``rpka.numerics``); ``rpka.kernel.law`` measures the heads the
law is fitted on and re-exports these names (``from rpka.kernel.law import predict_rank``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rpka.attention import METHOD_INFO
from rpka.io import read_json
from rpka.paths import RANK_LAW_JSON, resolve

EPSILONS = (0.1, 0.03, 0.01)  # the registered error levels
RHO_STATISTICS = ("rho_bound", "logit_range", "logit_std")  # the first is primary
KEY_RESIDUAL = 0.05  # keys' effective rank: at most 5 % of their centred energy left
LAW_FILE = RANK_LAW_JSON  # where predict_rank's fit lives
DEFAULT_EPS = 0.03  # predict_rank's error level, the report's figure's


def full_rank(method: str, n: int) -> int:
    """Landmarks that span every point: 2n joint points (RPKA, uniform), n keys (coreset)."""
    return n if METHOD_INFO[method].landmarks == "keys" else 2 * n


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
    eps: float = DEFAULT_EPS,
    method: str = "rpka",
    causal: bool = False,
    p: int = 1,
    fit: dict[str, Any] | None = None,
) -> int:
    """The rank at which ``method`` approximates the attention of one head to a relative
    output error ``eps``, by the fitted law (docs/rank_law.md, "Law v2"): the law's median
    log2 r_eps at the head's rho statistics, rounded up to an integer and capped at the
    method's full rank.

    q (L, d) or (B, L, d), k (n, d) or (B, n, d) for one head; v is not read (the law is
    fitted with each head's own v; it stands for a v of the scale trained heads have).
    ``causal``: the law is that of the bidirectional kernel, which the causal rows' prefixes
    never need more of (a row sees at most n keys), so the same rank is returned. ``p``:
    stored pairs (1 without). ``fit``: a fit per method (default :func:`load_fit`).
    """
    del v, causal  # documented above: the law reads neither
    check_eps(eps)
    if q.dim() == 2:
        q, k = q.unsqueeze(0), k.unsqueeze(0)
    if q.dim() != 3 or k.shape[:-2] != q.shape[:-2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q, k must be (n, d) or (B, n, d) alike, got {q.shape}, {k.shape}")
    fits = fit if fit is not None else load_fit()
    check_method(method, fits)
    return rank_of(head_statistics(q, k), k.shape[-2], k.shape[-1], eps, method, fits, p)


def check_eps(eps: float) -> None:
    """eps must lie in (0, 1) (ValueError naming it)."""
    if not 0 < eps < 1:
        raise ValueError(f"eps must lie in (0, 1), got {eps}")


def check_method(method: str, fits: dict[str, Any]) -> None:
    """``method`` must have a fit in ``fits`` (ValueError naming the fitted ones)."""
    if method not in fits or not fits[method].get("coef"):
        raise ValueError(f"method must be one of {sorted(fits)} (fitted), got {method!r}")


def rank_of(
    stats: dict[str, float], n: int, d: int, eps: float, method: str, fits: dict[str, Any],
    p: int = 1,
) -> int:  # fmt: skip
    """:func:`predict_rank` from a head's :func:`head_statistics` (computed once for
    several methods): 2 ** (x . b) rounded up, at least 1, at most the full rank."""
    law = fits[method]
    x = law_features(stats, d, n, eps, p, law["terms"], law["statistic"])
    log2_rank = float(x @ np.asarray(law["coef"]))
    return int(min(full_rank(method, n), max(1, math.ceil(2 ** min(log2_rank, 62)))))
