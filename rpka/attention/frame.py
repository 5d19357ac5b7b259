"""The frame RPKA pivots in, the estimator's first stage: scale, balance, centre.

    q~ = alpha q d^{-1/4},   k~ = (k d^{-1/4} - mean_j k_j d^{-1/4}) / alpha            (P)
    alpha^2 = ratio * max_j |k_j d^{-1/4} - mean| / max_i |q_i d^{-1/4}|
              (ratio 1 for the joint set [q~; k~], KEYS_RATIO for keys-only pivots)

Softmax attention sees q and k only through ``q.k / sqrt(d) = q~.k~`` for every
``alpha > 0``, and is unchanged by a common shift of the keys, so (P) changes no output; it
only moves the points the kernel is pivoted on (docs/design.md section 2; the one-screen
version: ``reference.pivoted_points``). The next stages: pivot selection
(``rpcholesky``, ``accelerated``, ``pivot_state``), the Nystrom estimate (``nystrom``,
``streamed``) and, causal, the landmark schedule (``causal_landmarks``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from rpka.attention.keys_coreset import WILDCAT_RHO

# keys-only pivots: the largest centred key balanced to 1/KEYS_RATIO of the largest query,
# WildCat's temperature rule (microsoft/wildcat), which keys-coreset uses; with equal
# lengths (ratio 1, the joint set's balance) full rank was off by 1e-4 at q x3 / k x10 in
# d = 8 (tests/test_asymmetric_scale.py): in a keys-only Nystrom the cancellation grows with
# the key norms alone, and shorter keys keep it down
KEYS_RATIO = WILDCAT_RHO


class Frame(NamedTuple):
    """Where the pivoted points live: ``q~ = q * q_scale``, ``k~ = k * k_scale - key_shift``.

    ``q_scale`` and ``k_scale`` are (..., 1, 1) tensors (detached), ``key_shift`` the
    (..., 1, d) mean of ``k * k_scale`` (guard 1), ``compute`` the dtype of the estimate.
    """

    compute: torch.dtype
    q_scale: Tensor
    k_scale: Tensor
    key_shift: Tensor


def balanced_frame(q: Tensor, k: Tensor, balance: bool = True, key_ratio: float = 1.0) -> Frame:
    """The frame of :func:`frame_and_reductions` (the scaled points of RPKA)."""
    return frame_and_reductions(q, k, balance, key_ratio)[0]


def frame_and_reductions(
    q: Tensor, k: Tensor, balance: bool = True, key_ratio: float = 1.0
) -> tuple[Frame, Tensor | None, Tensor]:
    """The frame, and two reductions taken on the way: the largest query norm (...,) per
    (batch, head) (None with ``balance=False``) and the key mean (..., 1, d).

    Each is finite only if every entry it reduces is (a nan or inf entry makes its row's
    norm, or the sum, non-finite), so the inference path reads its input check of q and k
    off them instead of summing q and k once more (:func:`rpka.attention.base.refuse_non_finite`;
    issue 39: two fewer passes over the inputs).

    The scaled points of RPKA for q (..., n, d), k (..., m, d), balanced per (batch, head).

    Softmax attention sees q and k only through ``q.k / sqrt(d) = (alpha q~).(k~ / alpha)``
    with ``q~ = q d^{-1/4}``, ``k~ = k d^{-1/4}``, for every ``alpha > 0``. The Nystrom
    estimate is exact at full rank for any alpha in exact arithmetic, but not in floating
    point: the key weights ``e^{|k~|^2/2}`` spread over many nats when the keys are long,
    and the solve with ``G_SS`` must then cancel terms ``g(s, k_j) w_j / w_s`` of size up to
    ``exp(max |z|^2 / 4)`` over the pivoted points z - an error of eps times that (measured:
    relative error 0.2-1.0 at full rank in float64 for q x10 / k x1 and q x1 / k x10,
    docs/numerics.md). ``alpha^2 = max |k~ - mean| / max |q~|`` makes the largest query and
    the largest centred key equally long, which minimises the largest norm of the joint
    set for the same logits; ``key_ratio`` > 1 makes the keys that much shorter (keys-only
    pivots, ``KEYS_RATIO``). The scales are detached (the output does not depend on
    alpha). ``balance=False`` gives alpha = 1.
    """
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = q.shape[-1] ** -0.25
    mean = k.mean(-2, keepdim=True, dtype=compute)  # (..., 1, d)
    ones = torch.ones(*q.shape[:-2], 1, 1, dtype=compute, device=q.device)
    if not balance:
        return Frame(compute, ones * scale, ones * scale, mean * scale), None, mean
    with torch.no_grad():
        q_max = torch.linalg.vector_norm(q, dim=-1, dtype=compute).amax(-1)
        # |k - mean|^2 = |k|^2 - 2 k.mean + |mean|^2 without a copy of the keys (its round-off
        # only moves alpha, which any value of leaves the estimate's target unchanged)
        k_sq = torch.linalg.vector_norm(k, dim=-1, dtype=compute).square()
        k_dot = (k @ mean.detach().to(k.dtype).transpose(-1, -2)).squeeze(-1).to(compute)
        k_max = (k_sq - 2 * k_dot + mean.detach().square().sum(-1)).clamp(min=0).amax(-1).sqrt()
        usable = (q_max > 0) & (k_max > 0) & torch.isfinite(q_max * k_max)
        ratio = key_ratio * k_max / torch.where(usable, q_max, 1.0)
        alpha = torch.where(usable, ratio, 1.0).sqrt()
        alpha = alpha[..., None, None]
    return Frame(compute, scale * alpha, scale / alpha, mean * (scale / alpha)), q_max, mean
