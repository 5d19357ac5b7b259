"""Nystromformer: segment-mean landmarks, three softmax kernels, iterative pseudo-inverse.

Source: Y. Xiong, Z. Zeng, R. Chakraborty, M. Tan, G. Fung, Y. Li, V. Singh,
"Nystromformer: A Nystrom-Based Algorithm for Approximating Self-Attention", AAAI 2021.

With ``q~ = q d^{-1/4}``, ``k~ = k d^{-1/4}`` and m landmarks ``Q~_L``, ``K~_L`` (the means
of m contiguous segments of the queries and of the keys), the paper approximates

    softmax(Q~ K~^T) V ~ softmax(Q~ K~_L^T) A^+ (softmax(Q~_L K~^T) V),
    A = softmax(Q~_L K~_L^T)                                             (m x m)

in O(n m d + m^3). ``A^+`` is the iterative Moore-Penrose pseudo-inverse of the paper
(after Razavi et al. 2014), 6 iterations from its initialisation:

    Z_0 = A^T / (||A||_1 ||A||_inf),
    Z_{j+1} = Z_j (13 I - A Z_j (15 I - A Z_j (7 I - A Z_j))) / 4.

With ``E = I - A Z`` the error obeys ``E' = E^3 (3 + E) / 4`` (third order), so after 6
steps the eigen-errors are ``~ (1 - sigma_min(A)^2 / (||A||_1 ||A||_inf))^(3^6)``: fast for
a well-conditioned A, not converged when A is near singular (e.g. two landmarks alike).

Choices stated: (1) the norms in Z_0 are those of each (batch, head) matrix, as in the
paper's formula (the authors' code offers a batch-wide maximum as its "original" option);
(2) when n is not a multiple of m the segments are uneven: token j goes to segment
``floor(j m / n)``, so segment lengths differ by at most one (the authors pad the sequence
instead); queries and keys are segmented separately and m is capped at min(n_q, n_k), so
``rank == n`` makes every segment one token; (3) the optional depthwise-convolution skip
connection on V of the paper's model is omitted - it is part of their layer, not of the
attention approximation; (4) by default the output is clamped to the range of the values
(RPKA's value-hull guard, counted in ``guard_counts``) because ``A^+`` can turn weights
negative; ``clamp=False`` gives the paper's output unchanged. Half-precision inputs are
computed in float32.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rpka.attention.base import AttentionMethod
from rpka.attention.guards import clamp_to_values
from rpka.attention.options import check_bool, check_positive_int, reject_causal

PINV_ITERATIONS = 6  # the paper's setting


def segment_means(x: Tensor, segments: int) -> Tensor:
    """Means of ``segments`` contiguous, near-equal segments: (..., n, d) -> (..., m, d).

    Token j belongs to segment ``floor(j m / n)`` (lengths differ by at most one);
    requires 1 <= m <= n.
    """
    n = x.shape[-2]
    index = torch.arange(n, device=x.device) * segments // n  # (n,)
    sums = x.new_zeros(*x.shape[:-2], segments, x.shape[-1]).index_add(-2, index, x)
    counts = torch.bincount(index, minlength=segments).to(x.dtype)
    return sums / counts.unsqueeze(-1)


def iterative_pinv(a: Tensor, iterations: int = PINV_ITERATIONS) -> Tensor:
    """The paper's iterative Moore-Penrose pseudo-inverse of a (..., m, m)."""
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    norm_1 = a.abs().sum(-2).amax(-1)  # max column sum
    norm_inf = a.abs().sum(-1).amax(-1)  # max row sum (1 for a softmax matrix)
    z = a.transpose(-1, -2) / (norm_1 * norm_inf)[..., None, None]
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


class NystromformerAttention(AttentionMethod):
    """Nystromformer attention (segment-mean landmarks, iterative pseudo-inverse).

    Options:
        rank: number of landmarks m >= 1; capped at the number of queries and of keys.
        pinv_iterations: iterations of the pseudo-inverse (the paper uses 6), >= 1.
        clamp: clamp the output to the value range (a guard; the paper has none).
    """

    name = "nystromformer"

    def __init__(
        self,
        rank: int = 64,
        pinv_iterations: int = PINV_ITERATIONS,
        clamp: bool = True,
        causal: bool = False,
        check_inputs: bool = True,
    ) -> None:
        super().__init__(causal=causal, check_inputs=check_inputs)
        self.rank = check_positive_int("rank", rank)
        self.pinv_iterations = check_positive_int("pinv_iterations", pinv_iterations)
        self.clamp = check_bool("clamp", clamp)
        reject_causal(self.name, causal)

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        compute = torch.float64 if q.dtype == torch.float64 else torch.float32
        scale = q.shape[-1] ** -0.25
        q_s = q.to(compute) * scale
        k_s = k.to(compute) * scale
        v_c = v.to(compute)
        m = min(self.rank, q.shape[-2], k.shape[-2])
        q_l = segment_means(q_s, m)  # (..., m, d)
        k_l = segment_means(k_s, m)
        f = torch.softmax(q_s @ k_l.transpose(-1, -2), dim=-1)  # (..., n, m)
        a = torch.softmax(q_l @ k_l.transpose(-1, -2), dim=-1)  # (..., m, m)
        b = torch.softmax(q_l @ k_s.transpose(-1, -2), dim=-1)  # (..., m, n_k)
        out = f @ (iterative_pinv(a, self.pinv_iterations) @ (b @ v_c))
        if self.clamp:
            out, clamped = clamp_to_values(out, v_c)
            self._guards = {"clamped": clamped, "entries": torch.tensor(out.numel())}
        return out.to(q.dtype)

    def extra_repr(self) -> str:
        return f"rank={self.rank}, pinv_iterations={self.pinv_iterations}, clamp={self.clamp}"
