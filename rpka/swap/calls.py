"""One SDPA call of the audit measured (``rpka.swap.measure``): its exact reference in
float64, the relative error against it, the logit spread, and the rank law at it
(issue 54 item 6; docs/rank_law.md, "Law v2"): the site's ``rho``, the rank the fitted law
predicts (``rpka.rank_law``) and the error measured at that rank (:class:`Law`).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rpka import rank_law
from rpka.swap.sdpa import SDPASwap, as_four_dims

LOGIT_ITEMS = 4  # batch items whose logits give logit_std and rho (a (L x S) matrix per head)


@contextlib.contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Global RNG seeded to ``seed`` inside, the caller's state restored after."""
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def relative_error(out: Tensor, ref: Tensor) -> float:
    """Mean over (batch item, head) of ``|out - ref|_F / |ref|_F``, outputs (..., L, Ev)."""
    diff = (out.double() - ref).reshape(-1, *ref.shape[-2:])
    num = torch.linalg.matrix_norm(diff)
    den = torch.linalg.matrix_norm(ref.reshape(-1, *ref.shape[-2:]))
    errors = torch.where(den > 0, num / den.clamp(min=1e-300), num)
    return float(errors.mean()) if errors.numel() else 0.0


def head_inputs(q: Tensor, k: Tensor, args: Mapping[str, Any]) -> tuple[Tensor, Tensor]:
    """The first items' q, k as (B, H, L, E) and (B, H, S, E) in float64, k's heads repeated
    to q's (GQA) and the call's scale folded into q, so that q.k / sqrt(E) are its logits."""
    q4, k4 = as_four_dims(q)[:LOGIT_ITEMS].double(), as_four_dims(k)[:LOGIT_ITEMS].double()
    if q4.shape[1] != k4.shape[1] and k4.shape[1]:  # GQA: the kv heads' groups
        k4 = k4.repeat_interleave(q4.shape[1] // k4.shape[1], 1)
    if args["scale"] is not None:
        q4 = q4 * (args["scale"] * math.sqrt(q4.shape[-1]))
    return q4, k4


def logit_std(q: Tensor, k: Tensor, args: Mapping[str, Any]) -> float:
    """Standard deviation of ``scale * q.k`` over the first items' visible (query, key)
    pairs (causal: the lower triangle), in float64."""
    q4, k4 = as_four_dims(q)[:LOGIT_ITEMS].double(), as_four_dims(k)[:LOGIT_ITEMS].double()
    if q4.shape[1] != k4.shape[1] and k4.shape[1]:  # GQA: the kv heads' groups
        k4 = k4.repeat_interleave(q4.shape[1] // k4.shape[1], 1)
    scale = args["scale"] if args["scale"] is not None else 1 / math.sqrt(max(q.shape[-1], 1))
    logits = (q4 @ k4.transpose(-1, -2)) * scale
    if args["is_causal"]:
        visible = torch.ones(logits.shape[-2:], dtype=torch.bool).tril()
        logits = logits[..., visible]
    return float(logits.std()) if logits.numel() > 1 else 0.0


class Law:
    """The rank law at each call site of the exact run (the module docstring's ``rho``,
    ``predicted_rank``, ``error_at_predicted``): ``fits`` per method (``rpka.rank_law``'s
    ``load_fit``), ``make(method, rank)`` a fresh swap of the audit's (its options); each
    call at the predicted rank draws from the global RNG seeded to ``seed`` and forked, so
    the exact run's own draws are left as they were."""

    def __init__(
        self, fits: Mapping[str, Any], eps: float, methods: Sequence[str],
        make: Callable[[str, int], SDPASwap], seed: int,
    ) -> None:  # fmt: skip
        self.fits, self.eps, self.make, self.seed = dict(fits), eps, make, seed
        self.methods = [m for m in dict.fromkeys(methods) if self.fits.get(m, {}).get("coef")]
        self.rho: dict[str, list[float]] = defaultdict(list)
        self.ranks: dict[tuple[str, str], list[int]] = defaultdict(list)
        self.errors: dict[tuple[str, str], list[float]] = defaultdict(list)

    def observe(self, site: str, q: Tensor, k: Tensor, v: Tensor, args: dict, ref: Tensor) -> None:
        """One exact call: each head's statistics, each method's predicted rank (the largest
        over heads) and its error at that rank against ``ref`` (exact SDPA, float64)."""
        q4, k4 = head_inputs(q, k, args)
        stats = [rank_law.head_statistics(q4[:, h], k4[:, h]) for h in range(q4.shape[1])]
        self.rho[site].append(max(s["rho_bound"] for s in stats))
        n, d = k4.shape[-2], k4.shape[-1]
        for method in self.methods:
            rank = max(rank_law.rank_of(s, n, d, self.eps, method, self.fits) for s in stats)
            swapper = self.make(method, rank)
            with seeded(self.seed, q.device):
                out = swapper.call(q, k, v, dict(args))
            served = bool(swapper.records and swapper.records[-1].swapped)
            self.ranks[site, method].append(rank)
            self.errors[site, method].append(relative_error(out, ref) if served else math.nan)

    def columns(self, site: str, method: str) -> dict[str, float]:
        """The site's three columns for ``method`` (NaN without a fit or a call)."""
        ranks, errors = self.ranks.get((site, method)), self.errors.get((site, method))
        return {
            "rho": max(self.rho[site]) if self.rho.get(site) else math.nan,
            "predicted_rank": max(ranks) if ranks else math.nan,
            "error_at_predicted": float(np.mean(errors)) if errors else math.nan,
        }


def float_mask(mask: Tensor | None) -> bool:
    return mask is not None and mask.is_floating_point()


def reference(swapper: SDPASwap, q: Tensor, k: Tensor, v: Tensor, args: dict) -> Tensor:
    """Exact SDPA (the original function) on the call's inputs in float64."""
    mask = args["attn_mask"]
    return swapper.original(
        q.double(), k.double(), v.double(),
        **{**args, "attn_mask": mask.double() if float_mask(mask) else mask},
    )  # fmt: skip


def law_of(
    law_eps: float | None, law_fit: Mapping[str, Any] | None
) -> tuple[Mapping[str, Any] | None, str]:
    """The fit per method the audit's law columns use, and where it came from: ``law_fit``
    if given, else the committed one (``rpka.rank_law.load_fit``); None (with why, warned)
    where ``law_eps`` is None or no fit is there."""
    if law_eps is None:
        return None, "law_eps=None: no law columns"
    if not isinstance(law_eps, int | float) or not 0 < law_eps < 1:
        raise ValueError(f"law_eps must be a number in (0, 1) or None, got {law_eps!r}")
    if law_fit is not None:
        return law_fit, "law_fit (given)"
    try:
        return rank_law.load_fit(), rank_law.LAW_FILE
    except (FileNotFoundError, ValueError) as err:
        warnings.warn(f"rpka.swap.audit: no rank law ({err}); rho and the predicted "
                      "rank are left NaN", stacklevel=3)  # fmt: skip
        return None, str(err)


def law_columns(law: Law | None, site: str, method: str) -> dict[str, float]:
    if law is None:
        return {"rho": math.nan, "predicted_rank": math.nan, "error_at_predicted": math.nan}
    return law.columns(site, method)
