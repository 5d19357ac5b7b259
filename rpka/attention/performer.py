"""Performer / FAVOR+: positive orthogonal random features for the softmax kernel.

Source: K. Choromanski, V. Likhosherstov, D. Dohan, X. Song, A. Gane, T. Sarlos,
P. Hawkins, J. Davis, A. Mohiuddin, L. Kaiser, D. Belanger, L. Colwell, A. Weller,
"Rethinking Attention with Performers", ICLR 2021.

With ``q~ = q d^{-1/4}``, ``k~ = k d^{-1/4}`` and m features ``omega_f ~ N(0, I_d)``, the
positive random features (their Lemma 1)

    phi(x) = exp(-|x|^2 / 2) / sqrt(m) * [exp(omega_f . x)]_{f=1..m}

give an unbiased estimate ``E[phi(x) . phi(y)] = exp(x . y)`` with strictly positive
terms, so attention becomes

    out = phi(Q~) (phi(K~)^T V) / phi(Q~) (phi(K~)^T 1)                   (O(n m d))

whose weights are positive: the output is a convex combination of the values and the
denominator cannot vanish in exact arithmetic. The features are *orthogonal random
features* (their Section 2.4): blocks of d rows of a Haar-random orthogonal matrix (QR of a
Gaussian matrix, signs fixed by diag R), each row rescaled to a chi(d)-distributed norm so
that every omega_f is still marginally N(0, I_d) - the estimate stays unbiased while the
orthogonality lowers its variance.

Numerical stabiliser. Factors that are constant per query, or common to every query and
key, cancel between numerator and denominator. The authors' code subtracts the maximum of
the exponents (per query; over all keys) and adds a small epsilon. Here the same idea is
taken one step further and without the epsilon: each key feature column is divided by its
own maximum ``e^{c_f}``, ``c_f = max_j (omega_f . k~_j - |k~_j|^2/2)``, and the query side
absorbs it, ``exp(omega_f . q~ + c_f - max_f(...))``. Both factors cancel exactly, every
exponent is <= 0, and the denominator is >= 1 (the maximising feature of a query meets
the key that attains ``c_f``), so nothing overflows or divides by zero, even for inputs with
norms x30 in float32. ``-|q~|^2/2`` and ``1/sqrt(m)`` are dropped: they cancel.

Features are drawn once, at the first call (for the head dimension d then seen), from
``generator`` (or torch's global RNG), and kept fixed in a non-persistent buffer - the
usual choice for training; ``redraw=True`` draws new ones at every call. Non-causal only:
the prefix-sum causal form is not implemented (``causal=True`` raises).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rpka.attention.base import AttentionMethod
from rpka.attention.options import (
    check_bool,
    check_generator,
    check_positive_int,
    reject_causal,
)


def orthogonal_gaussian(
    num_features: int,
    dim: int,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """(m, d) random features: orthogonal within blocks of d rows, rows marginally N(0, I_d).

    Drawn on the generator's device (CPU by default).
    """
    device = generator.device if generator is not None else torch.device("cpu")
    blocks = []
    for _ in range(math.ceil(num_features / dim)):
        gauss = torch.randn(dim, dim, generator=generator, dtype=dtype, device=device)
        q, r = torch.linalg.qr(gauss)
        # sign fix makes q Haar-distributed (QR alone is biased by the sign convention)
        blocks.append((q * torch.sign(torch.diagonal(r)).unsqueeze(-2)).transpose(-1, -2))
    directions = torch.cat(blocks)[:num_features]  # unit rows
    norms = torch.randn(num_features, dim, generator=generator, dtype=dtype, device=device).norm(
        dim=-1
    )  # chi(d): the norm of an N(0, I_d) vector
    return directions * norms.unsqueeze(-1)


def positive_features(x: Tensor, omega: Tensor) -> Tensor:
    """FAVOR+ features as written in the paper, unstabilised: (..., n, d) -> (..., n, m).

    ``phi(x) = exp(omega x - |x|^2/2) / sqrt(m)``, so ``E[phi(x) . phi(y)] = exp(x . y)``.
    For moderate norms only (it overflows where the attention path does not).
    """
    logits = x @ omega.transpose(-1, -2) - x.pow(2).sum(-1, keepdim=True) / 2
    return torch.exp(logits) / math.sqrt(omega.shape[0])


class PerformerAttention(AttentionMethod):
    """FAVOR+ attention with positive orthogonal random features (non-causal).

    Options:
        rank: number of random features m >= 1.
        redraw: draw new features at every call (default: fixed after the first call).
        generator: optional ``torch.Generator`` for the feature draws.
    """

    name = "performer"
    omega: Tensor | None

    def __init__(
        self,
        rank: int = 64,
        redraw: bool = False,
        generator: torch.Generator | None = None,
        causal: bool = False,
        check_inputs: bool = True,
    ) -> None:
        super().__init__(causal=causal, check_inputs=check_inputs)
        self.rank = check_positive_int("rank", rank)
        self.redraw = check_bool("redraw", redraw)
        self.generator = check_generator(generator)
        reject_causal(self.name, causal)
        # not persistent: the state dict of a model does not depend on the head size seen
        self.register_buffer("omega", None, persistent=False)

    def features(self, dim: int, like: Tensor) -> Tensor:
        """The (m, d) projection, drawn on first use (or every call with ``redraw``)."""
        if self.redraw or self.omega is None or self.omega.shape[-1] != dim:
            omega = orthogonal_gaussian(self.rank, dim, self.generator, dtype=like.dtype)
            self.omega = omega.to(like.device)
        return self.omega.to(device=like.device, dtype=like.dtype)

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        compute = torch.float64 if q.dtype == torch.float64 else torch.float32
        scale = q.shape[-1] ** -0.25
        q_s = q.to(compute) * scale
        k_s = k.to(compute) * scale
        omega = self.features(q.shape[-1], q_s)  # (m, d)

        key_logits = k_s @ omega.T - k_s.pow(2).sum(-1, keepdim=True) / 2  # (..., n_k, m)
        key_max = key_logits.amax(-2, keepdim=True).detach()  # c_f, cancels exactly
        psi = torch.exp(key_logits - key_max)  # (..., n_k, m), column max 1
        v1 = torch.cat([v.to(compute), torch.ones_like(v[..., :1], dtype=compute)], dim=-1)
        kv = psi.transpose(-1, -2) @ v1  # (..., m, d_v + 1)

        query_logits = q_s @ omega.T + key_max  # (..., n, m)
        phi = torch.exp(query_logits - query_logits.amax(-1, keepdim=True).detach())
        full = phi @ kv  # (..., n, d_v + 1); denominator >= 1
        return (full[..., :-1] / full[..., -1:]).to(q.dtype)

    def extra_repr(self) -> str:
        return f"rank={self.rank}, redraw={self.redraw}"
