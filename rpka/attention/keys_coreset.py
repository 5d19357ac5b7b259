"""Attention over a weighted coreset of keys chosen by RPCholesky (WildCat-like).

Source: T. Schroeder, L. Mackey, "WildCat: Near-Linear Attention in Theory and Practice",
PMLR 306 (2026), arXiv:2602.10056; reference code github.com/microsoft/wildcat.

The design. With ``beta = d^{-1/2}``, attention weights key l for query q by
``exp(beta q.k_l)``. WildCat keeps r keys ``K_S`` and approximates every key's feature
function from them, ``exp(beta <k_l, .>) ~ sum_{s in S} exp(beta <k_s, .>) W_sl``, with the
Nystrom weights of a *tempered* exponential kernel ``E_tau(x, y) = exp(beta x.y / tau^2)``:

    W = E_tau(K_S, K_S)^{-1} E_tau(K_S, K),
    out = exp(beta Q K_S^T) (W V) / exp(beta Q K_S^T) (W 1)           (O(n r d) after W)

so attention runs over r keys carrying the compressed values ``W V`` and weights ``W 1``.
The coreset ``S`` is drawn by RPCholesky on the tempered keys ``k' = k beta^{1/2} / tau``,
sampling proportional to the residual diagonal of ``E_tau`` itself (``weighting="exp"``).
With ``tau > 1`` the key norms shrink before sampling, which softens RPCholesky's pull
towards the largest keys (docs/design.md section 2). At r = number of keys, ``W = I``: exact.

How it is computed here (same algebra, overflow-free). ``E_tau = D G D`` with the Gaussian
``G = g(k', k')`` and ``D = diag(e^{|k'|^2/2})``, hence ``W = D_S^{-1} G_SS^{-1} G_SK D_K``.
The key side ``G_SS^{-1} G_SK [D_K V, D_K 1]`` is :func:`rpka.attention.nystrom.nystrom_core`
(the shared Nystrom solve, one log scale per landmark); the query side
``exp(beta q.k_s) e^{-|k'_s|^2/2} = exp((tau q~).k'_s - |k'_s|^2/2)`` is
:func:`rpka.attention.nystrom.nystrom_readout` at the points ``tau q~`` (logits with the row
maximum subtracted, as in a softmax, so large queries cannot underflow). In other words:
keys-coreset is RPKA's estimator with pivots from the keys only, sampled with the
exponential weighting, after mapping ``q~ -> tau q~`` and ``k~ -> k~ / tau``.

Implemented as in the paper / reference code: RPCholesky coreset of keys only, tempered
exponential-kernel pivot distribution, Nystrom weights, keys centred by their mean (exact
invariance of softmax), output clamped to the value range, the temperature rule
``tau = sqrt(rho * max_l |k_l| / max_i |q_i|)``, ``rho = 3.94582``, per (batch, head), taken
from the reference code's ``compress_kv`` (I could not read the paper body; only its
abstract, the project page's weight formula and the code).

Departures: (1) no sequence bins (WildCat's ``num_bins``, default 1 there too); (2) the
denominator is floored at ``den_floor`` times ``sum_s a_s |c_s|`` (the magnitude of the
terms it sums) and floored/clamped entries are counted - RPKA's guards, so that the two
are comparable; (3) the pivots are drawn without gradient but the landmarks, weights and
output are differentiable in q, k, v (WildCat is inference-only; the bench trains with
it), and the temperature is treated as a constant (no gradient through the max norms);
(4) the plain sequential pivot loop of :func:`rpcholesky` is used, not WildCat's compiled
or Triton kernels, so timings say nothing about their implementation.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rpka.attention.base import AttentionMethod
from rpka.attention.nystrom import (
    exact_with_counts,
    gather_points,
    nystrom_core,
    nystrom_readout,
)
from rpka.attention.options import (
    check_generator,
    check_open_unit,
    check_positive_int,
    reject_causal,
)
from rpka.attention.rpcholesky import rpcholesky

# rho in tau = sqrt(rho * max|k| / max|q|): microsoft/wildcat, wildcat/compress_kv.py (RHO_2)
WILDCAT_RHO = 3.94582


@torch.no_grad()
def wildcat_temperature(q: Tensor, k: Tensor, rho: float = WILDCAT_RHO) -> Tensor:
    """tau = sqrt(rho * max_l |k_l| / max_i |q_i|) per (batch, head): (..., n, d) -> (..., 1, 1).

    The ratio is invariant to a common scale of q and k. Where either maximum is 0 (all
    queries zero, or all centred keys equal) the choice is immaterial and tau = 1.
    """
    q_max = q.norm(dim=-1).amax(-1)
    k_max = k.norm(dim=-1).amax(-1)
    usable = (q_max > 0) & (k_max > 0)
    tau = torch.sqrt(rho * k_max / torch.where(usable, q_max, 1.0))
    return torch.where(usable, tau, 1.0)[..., None, None]


class KeysCoresetAttention(AttentionMethod):
    """WildCat-like attention over r RPCholesky-selected keys with Nystrom weights.

    Options:
        rank: coreset size r >= 1; capped at the number of keys (then exact).
        temperature: tau > 0, or None for WildCat's rule (see :func:`wildcat_temperature`).
            ``temperature=1.0`` samples and weights with the untempered kernel.
        den_floor: relative denominator floor, in (0, 1).
        generator: optional ``torch.Generator`` for the pivot draws.
    """

    name = "keys-coreset"

    def __init__(
        self,
        rank: int = 64,
        temperature: float | None = None,
        den_floor: float = 1e-6,
        generator: torch.Generator | None = None,
        causal: bool = False,
        check_inputs: bool = True,
    ) -> None:
        super().__init__(causal=causal, check_inputs=check_inputs)
        self.rank = check_positive_int("rank", rank)
        if temperature is not None and (
            isinstance(temperature, bool)
            or not isinstance(temperature, int | float)
            or not 0.0 < temperature < math.inf
        ):
            raise ValueError(
                f"temperature must be a positive finite number or None, got {temperature!r}"
            )
        self.temperature = None if temperature is None else float(temperature)
        self.den_floor = check_open_unit("den_floor", den_floor)
        self.generator = check_generator(generator)
        reject_causal(self.name, causal)

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if self.rank >= k.shape[-2]:
            # the coreset of every key: exact by Nystrom's identity, applied rather than
            # computed (rpka.attention.nystrom.estimate_unless_keys_covered); no draw, whose
            # float32 floor could drop small keys
            out, self._guards = exact_with_counts(q, k, v)
            return out
        compute = torch.float64 if q.dtype == torch.float64 else torch.float32
        scale = q.shape[-1] ** -0.25  # beta^{1/2}
        q_s = q.to(compute) * scale
        k_s = k.to(compute) * scale
        k_s = k_s - k_s.mean(-2, keepdim=True)  # softmax is invariant to a common key shift
        tau = (
            wildcat_temperature(q_s, k_s)
            if self.temperature is None
            else torch.tensor(self.temperature, dtype=compute, device=q.device)
        )
        k_t = k_s / tau  # tempered keys k': E_tau(k_a, k_b) = exp(k'_a . k'_b)
        pivots = rpcholesky(k_t, self.rank, "rpc", self.generator, weighting="exp").pivots
        valid = pivots >= 0
        landmarks = gather_points(k_t, pivots)  # (..., r, d), differentiable in k
        v_c = v.to(compute)
        core = nystrom_core(k_t, v_c, landmarks, valid)  # (..., r, d_v + 1)
        # query side: exp(beta q.k_s) e^{-|k'_s|^2/2} = exp((tau q~).k'_s - |k'_s|^2/2)
        out, self._guards = nystrom_readout(tau * q_s, landmarks, valid, core, v_c, self.den_floor)
        return out.to(q.dtype)

    def extra_repr(self) -> str:
        tau = "wildcat" if self.temperature is None else self.temperature
        return f"rank={self.rank}, temperature={tau}"
