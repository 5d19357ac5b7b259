"""Nystrom attention on uniformly sampled landmarks of the joint set (Skyformer-like).

Source: Y. Chen, Q. Zeng, H. Ji, Y. Yang, "Skyformer: Remodel Self-Attention with Gaussian
Kernel and Nystrom Method", NeurIPS 2021. Skyformer observes that the query-key block of a
kernel is not symmetric, embeds it in the PSD kernel matrix of the joint set ``[Q; K]``
(2n points) and applies the Nystrom method there with landmarks sampled uniformly.

What this module implements: exactly RPKA's estimator (``rpka.attention.rpka``) with the
pivot rule ``"uniform"`` on the joint set - uniform landmarks without replacement, the
Gaussian factorisation of the *softmax* kernel ``exp(q~.k~)`` with log-domain key weights,
a Cholesky solve of ``G_SS``, and RPKA's three guards (key centring, denominator floor,
value-hull clamp). It is the ablation "RPKA minus residual pivoting".

Departures from Skyformer, on purpose: Skyformer replaces softmax by an *unnormalised*
Gaussian kernel (``Kernelized Attention``) and inverts the landmark block with a
Newton-Schulz iteration; here the target stays softmax attention (so every peer
approximates the same thing) and ``G_SS`` is solved exactly. Landmarks that duplicate an
earlier one to round-off are dropped by the shared pivot loop (a uniform draw would
otherwise make ``G_SS`` singular), so this method pays the same sequential pivot loop as
``rpka``; its timings are those of that loop, not of a one-shot uniform draw.
"""

from __future__ import annotations

import torch

from rpka.attention.options import reject_causal
from rpka.attention.rpka import RPKAttention


class NystromUniformAttention(RPKAttention):
    """Skyformer-like Nystrom attention: ``rpka`` with uniform landmarks on ``[Q~; K~]``.

    Options:
        rank: number of landmarks r >= 1; capped at the 2n joint points (then exact).
        den_floor: relative denominator floor, in (0, 1).
        generator: optional ``torch.Generator`` for the landmark draws.
        key_precision: the inference key side, as RPKA's (``"auto"`` or ``"float64"``).
    """

    name = "nystrom-uniform"

    def __init__(
        self,
        rank: int = 64,
        den_floor: float = 1e-6,
        generator: torch.Generator | None = None,
        causal: bool = False,
        check_inputs: bool = True,
        key_precision: str = "auto",
    ) -> None:
        reject_causal(self.name, causal)
        super().__init__(
            rank=rank,
            pivot_rule="uniform",
            pivot_set="joint",
            weighting="gauss",  # ignored by the uniform rule; gauss avoids any exp overflow
            den_floor=den_floor,
            generator=generator,
            causal=causal,
            check_inputs=check_inputs,
            key_precision=key_precision,
        )
