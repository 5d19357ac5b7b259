"""The Nystrom estimate of softmax attention on given landmarks, the math as it runs: the
key-side core, the query-side readout, and Nystrom's identity where the landmarks hold every
key. Shared by ``rpka.py``, ``causal.py`` and ``causal_landmarks.py``, ``keys_coreset.py`` and
the two streamed passes of it (``nystrom_chunked.py`` for inference, ``streamed.py`` for
training). Equations (docs/design.md section 2), with scaled and centred points ``q~``, ``k~``:

    e^{q~.k~} = e^{|q~|^2/2} g(q~, k~) e^{|k~|^2/2},   g(x, y) = exp(-|x - y|^2 / 2)       (G)
    g(q~, k~) ~ G_QS G_SS^{-1} G_SK  on landmarks Z_S,   w_j = e^{|k~_j|^2/2}              (N)
    out = G_QS G_SS^{-1} G_SK (w * V) / G_QS G_SS^{-1} G_SK w     (the query factor cancels)

computed in two halves, each in a log scale so that no exponent is taken on its own:

    key side (key_moments, solve_graded), in float64:
      rho_s = max_j (s.k~_j - |s|^2/2),   M_s = sum_j exp(s.k~_j - |s|^2/2 - rho_s) [v_j, 1]
      C = G_SS^{-1} diag(e^{rho}) M = diag(e^{lambda}) C^,   rows of C^ of size 1     (Core)
    readout (nystrom_readout), in the compute dtype:
      a_is = exp(q~_i.s - |s|^2/2 + lambda_s - max_s(...)),   out_i = (a C^)_{:d_v} / (a C^)_{d_v}
      guarded (rpka.attention.guards.guarded_ratio)

Where the landmarks hold every key ``G_QS G_SS^{-1} G_SK = G_QK`` and the estimate is
softmax attention: that is applied, not computed (:func:`estimate_unless_keys_covered`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from rpka.attention.guards import guarded_ratio
from rpka.attention.rpcholesky import gaussian_kernel

# the key side (moments and the r x (d_v + 1) solve) runs in float64 whatever the input
# dtype: see key_moments; the readout stays in the compute dtype (float32 or float64)
CORE_DTYPE = torch.float64
SIZE_FLOOR = torch.finfo(CORE_DTYPE).tiny ** 0.5  # ~1e-154 (see solve_core)


def gather_points(points: Tensor, index: Tensor) -> Tensor:
    """points (..., N, d), index (..., r) with -1 for none -> (..., r, d) (zeros for -1)."""
    safe = index.clamp(min=0)
    out = torch.gather(points, -2, safe.unsqueeze(-1).expand(*safe.shape, points.shape[-1]))
    return out * (index >= 0).unsqueeze(-1).to(points.dtype)


def keys_covered(pivots: Tensor, key_offset: int, n_keys: int) -> Tensor:
    """(...,) bool: every key is a landmark. pivots (..., r) index the pivoted points, -1
    in unused slots; key j is point ``key_offset + j`` (the joint set ``[Q~; K~]`` puts the
    n queries first: offset n; a keys-only set: offset 0)."""
    hit = torch.zeros(
        *pivots.shape[:-1], key_offset + n_keys + 1, dtype=torch.bool, device=pivots.device
    )
    slot = torch.where(pivots >= 0, pivots, hit.shape[-1] - 1)  # unused slots: a spare column
    hit.scatter_(-1, slot, True)
    return hit[..., key_offset : key_offset + n_keys].all(-1)


def exact_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Softmax attention (torch SDPA) in the compute dtype, returned in q's dtype."""
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    out = torch.nn.functional.scaled_dot_product_attention(*(x.to(compute) for x in (q, k, v)))
    return out.to(q.dtype)


def exact_with_counts(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """Softmax attention (:func:`exact_attention`) and guard counts of none fired, the pair
    an estimate returns: for a call whose landmarks hold every key."""
    exact = exact_attention(q, k, v)
    zero = torch.tensor(0)
    rows, entries = exact[..., :1].numel(), exact.numel()
    counts = {"denominator": zero, "rows": torch.tensor(rows), "clamped": zero}
    return exact, {**counts, "entries": torch.tensor(entries)}


def estimate_unless_keys_covered(
    estimate: Callable[[], tuple[Tensor, dict[str, Tensor]]],
    q: Tensor,
    k: Tensor,
    v: Tensor,
    covered: Tensor,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The Nystrom ``estimate()`` (out, guard counts), with softmax attention where
    ``covered`` (every key is a landmark).

    Nystrom's identity: for landmarks ``S`` that contain every key, ``G_SS^{-1} G_SK`` is
    the selection of the key columns, so ``G_QS G_SS^{-1} G_SK = G_QK`` and the estimate
    *is* softmax attention, for every input (so are its gradients). Evaluated through the
    solve it is not, in floating point: at sharp attention (logit std ~100) the terms
    ``g(q, k_j) w_j`` the softmax needs lie below the solve's round-off (eps times the
    landmarks' own kernel diagonal, 1), and a joint set with every point pivoted came out
    ~50 % wrong (docs/numerics.md). So the identity is applied, not computed: exact
    attention (torch SDPA) on those batch elements, the estimate elsewhere; when every
    element is covered the estimate is not computed at all (and no guard fires).
    q (..., n, d), k (..., m, d), v (..., m, d_v), covered (...,) bool; out (..., n, d_v)
    in q's dtype.
    """
    if bool(covered.all()):
        return exact_with_counts(q, k, v)
    out, counts = estimate()
    out = out.to(q.dtype)
    if bool(covered.any()):
        out = torch.where(covered[..., None, None], exact_attention(q, k, v), out)
    return out, counts


class Core(NamedTuple):
    """The key side ``C = G_SS^{-1} G_SK [w v, w]`` (..., r, d_v + 1) in a log scale per
    landmark: ``C = diag(e^{log_scale}) scaled``, each row of ``scaled`` with weight +-1.

    The log scale is folded into the readout logits before their row maximum, so no
    exponent of the estimator is taken on its own: ``w_j`` and ``g(x, k_j)`` underflow
    float32 separately at sharp attention (logit std >~ 12) while their product is the
    dominant term (docs/numerics.md).
    """

    scaled: Tensor
    log_scale: Tensor  # (..., r); -inf for invalid landmarks


def landmark_logits(x: Tensor, landmarks: Tensor, valid: Tensor) -> Tensor:
    """``x.s - |s|^2/2``: x (..., n, d), landmarks (..., r, d) -> (..., n, r), -inf where not
    valid. ``log g(x, s) + |x|^2/2``: the Gaussian kernel without its x factor."""
    logits = x @ landmarks.transpose(-1, -2) - landmarks.pow(2).sum(-1).unsqueeze(-2) / 2
    return logits.masked_fill(~valid.unsqueeze(-2), float("-inf"))


# The floor of an exponent before the estimator's in-place exps (:func:`exp_floored_`).
# torch's CPU exp leaves its vector path for any argument whose result is not a normal
# number (below -87.34 in float32, -708.4 in float64; -inf included): 10 against 0.2 ms for
# 262,144 float32 entries, one thread; and a matrix product whose products come out
# subnormal runs ~100x slower (issue 55: 40 of 245 ms of a causal forward at logit std 3).
# So the floor sits where a term times an entry of the core (rows scaled to size 1, entries
# down to ~2^-20 of it) stays normal: e^-60 2^-20 ~ 8e-33 (float32). A term floored here is
# ~9e-27 instead of something smaller - below the resolution of every sum it joins, whose
# largest term is 1: outputs were bit for bit the unfloored ones at logit std 1 to 12.
EXP_FLOOR = {torch.float32: -60.0, torch.float64: -600.0}


def exp_floored_(x: Tensor) -> Tensor:
    """``x.exp_()`` with x first floored at :data:`EXP_FLOOR` (in place, no autograd)."""
    floor = EXP_FLOOR.get(x.dtype)
    return (x if floor is None else x.clamp_(min=floor)).exp_()


def finite_or_zero(x: Tensor) -> Tensor:
    """A log reference: -inf (nothing to refer to) becomes 0, so ``x - ref`` stays -inf.

    Any non-finite entry, nan included, becomes +0; finite ones are kept. Without autograd
    this is one ``nan_to_num`` (``isfinite`` alone is four ops, issue 39); with it, the
    ``where`` whose gradient is exactly zero at the replaced entries.
    """
    if x.requires_grad:
        return torch.where(torch.isfinite(x), x, torch.zeros_like(x))
    return torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)


def key_moments(k_s: Tensor, v: Tensor, landmarks: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """``G_SK [w v, w]`` in a log reference per landmark: ``(rho, moments)``, in float64.

    ``g(s, k_j) w_j = exp(s.k_j - |s|^2/2)`` (with ``w_j = e^{|k_j|^2/2}``): one exponent per
    term, against ``rho_s = max_j (s.k_j - |s|^2/2)`` (detached, a reference only), so each
    row of ``moments`` (..., r, d_v + 1) lies in [0, m] and ``G_SK [w v, w] =
    diag(e^{rho}) moments``. k_s (..., m, d), v (..., m, d_v).

    Why float64 (``CORE_DTYPE``): at full rank the solve ``G_SS^{-1}`` cancels terms of rows
    whose scales ``e^{rho}`` differ by many orders of magnitude; a relative error ``delta`` in
    a large row then lands on a small one as ``delta e^{rho_big - rho_small}``. The logits
    are ~100 at logit std 36, so float32 gives ``delta ~ 1e-5`` (measured: 1e-3 error on
    repeated keys at std 36); float64 keeps it below 1e-10 (docs/numerics.md).
    """
    k_s, v, landmarks = (x.to(CORE_DTYPE) for x in (k_s, v, landmarks))
    logits = landmark_logits(k_s, landmarks, valid)  # (..., m, r)
    rho = finite_or_zero(logits.amax(-2).detach())  # (..., r)
    terms = torch.exp(logits - rho.unsqueeze(-2))
    ones = torch.ones_like(v[..., :1])
    return rho, terms.transpose(-1, -2) @ torch.cat([v, ones], dim=-1)


def solve_core(rho: Tensor, moments: Tensor, chol: Tensor, dtype: torch.dtype) -> Core:
    """``G_SS^{-1} diag(e^{rho}) moments`` as a :class:`Core`, solved in float64.

    The per-landmark references spread over many nats at sharp attention, past float32's
    range; the r x (d_v + 1) solve is small, so it runs in float64 against the largest
    reference, and each row of the result gets its own log scale again. ``chol`` is the
    Cholesky factor of ``G_SS`` (any float dtype); ``dtype`` that of the returned core.
    """
    return core_of(*raw_core(rho, moments, chol), dtype)


def core_of(core: Tensor, top: Tensor, dtype: torch.dtype, out: Tensor | None = None) -> Core:
    """:func:`solve_core`'s result from its raw solve (:func:`raw_core`): each row divided by
    its size (:func:`row_sizes`), the size's log added to the row's log scale. ``out``
    (``core``'s shape, ``dtype``) takes the divided rows where given: the same values."""
    size, live = row_sizes(core)
    log_scale = torch.where(live, size.log(), float("-inf")).squeeze(-1) + top
    scaled = (core / size).to(dtype) if out is None else torch.div(core, size, out=out)
    return Core(scaled, log_scale.to(dtype))


def raw_core(rho: Tensor, moments: Tensor, chol: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`solve_core`'s float64 solve: ``G_SS^{-1} diag(e^{rho - top}) moments``
    (..., r, d_v + 1) against the largest reference ``top`` (..., 1)."""
    rho, moments = rho.to(CORE_DTYPE), moments.to(CORE_DTYPE)
    top = rho.amax(-1, keepdim=True)  # (..., 1)
    rhs = moments * torch.exp(rho - top).unsqueeze(-1)
    return torch.cholesky_solve(rhs, chol.to(CORE_DTYPE)), top


def row_sizes(core: Tensor) -> tuple[Tensor, Tensor]:
    """The size each row of a raw core (..., r, d_v + 1) is divided by (..., r, 1), detached,
    and whether the row is nonzero (..., r, 1).

    Any positive size per row is exact (it moves between lambda and the row). The size of
    a row, |c_s| = max(|weight entry|, 2^-20 |largest entry|), is rescaled to 1: the
    denominator's terms are then a_s (+-1) and the relative floor den_floor * sum_s a_s
    |c_s| = den_floor * sum_s a_s >= den_floor (the row maximum of a is 1), and no entry
    exceeds 2^20, so no gradient overflows. A row more than ~350 nats below the top one
    keeps a smaller size (SIZE_FLOOR), likewise."""
    magnitude = core.detach().abs()
    largest = magnitude.amax(-1, keepdim=True)
    size = torch.maximum(magnitude[..., -1:], largest * 2.0**-20).clamp(min=SIZE_FLOOR)
    return size, largest > 0


def solve_graded(
    rho: Tensor, moments: Tensor, landmarks: Tensor, valid: Tensor, dtype: torch.dtype
) -> Core:
    """:func:`solve_core` with the landmarks eliminated from the largest row scale down.

    ``G_SS^{-1} diag(e^{rho}) moments`` is the same in any order of the landmarks, but not
    its round-off: at full rank the solve must cancel terms ``g(s, z) e^{rho_z - rho_s}``
    that can exceed 1 by many orders of magnitude (a long key seen from a short landmark),
    and eliminating the landmarks of the largest scale ``rho`` first keeps the Cholesky
    factor graded like the right-hand side, so those terms cancel at their own size (as
    diagonal pivoting by size does for the weighted kernel ``D G D``; docs/numerics.md).
    rho (..., r), moments (..., r, d_v + 1), landmarks (..., r, d), valid (..., r).
    """
    key = torch.where(valid, rho.detach().to(CORE_DTYPE), float("-inf"))
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices  # (..., r)
    back = order.argsort(-1)

    def take(x: Tensor, index: Tensor) -> Tensor:
        if x.dim() == index.dim():
            return x.gather(-1, index)
        return x.gather(-2, index.unsqueeze(-1).expand(*index.shape, x.shape[-1]))

    chol = landmark_cholesky(take(landmarks, order), take(valid, order))
    core = solve_core(take(rho, order), take(moments, order), chol, dtype)
    return Core(take(core.scaled, back), take(core.log_scale, back))


def nystrom_core(k_s: Tensor, v: Tensor, landmarks: Tensor, valid: Tensor) -> Core:
    """Key side of the Nystrom estimate: ``G_SS^{-1} G_SK [w * V, w]`` as a :class:`Core`.

    Args:
        k_s: (..., m, d) scaled (and centred) keys.
        v: (..., m, d_v) values, same dtype as k_s.
        landmarks: (..., r, d) landmark points.
        valid: (..., r) bool; invalid landmarks are ignored (log scale -inf).

    The last column carries the key weights ``w_j = e^{|k_j|^2/2}``: the key factor of
    ``exp(q.k)``, never exponentiated apart from ``g`` (:func:`key_moments`).
    """
    rho, moments = key_moments(k_s, v, landmarks, valid)
    return solve_graded(rho, moments, landmarks, valid, k_s.dtype)


def landmark_cholesky(landmarks: Tensor, valid: Tensor) -> Tensor:
    """Cholesky factor of ``G_SS + jitter I`` (..., r, r), always in float64.

    The block is tiny (r x r), and in float32 a Gram of pivots whose residuals were near
    round-off can lose definiteness to rounding (seen in training at r = 64 of 192 points).
    The Gram of the (float32 or float64) landmark points is formed in float64 and jittered
    by 10 float64 eps: pivots have residuals above ``pivot_floor`` (far above it), and a
    float32-sized jitter would perturb the smallest of them by up to 10 %, an error that
    cancellation in the readout then amplifies. Invalid landmarks get identity rows.
    """
    lm = landmarks.to(torch.float64)
    g_ss = gaussian_kernel(lm, lm)
    jitter = 10 * torch.finfo(torch.float64).eps
    all_valid = bool(valid.all())
    if all_valid and not g_ss.requires_grad:
        # no mask, and the jitter on the diagonal in place: off it, + 0 changes no entry
        # (none is -0), so these are the values below with fewer ops (issue 55)
        g_ss.diagonal(dim1=-2, dim2=-1).add_(jitter)
        return torch.linalg.cholesky(g_ss)
    eye = torch.eye(lm.shape[-2], dtype=torch.float64, device=lm.device)
    if not all_valid:
        g_ss = torch.where(valid.unsqueeze(-1) & valid.unsqueeze(-2), g_ss, eye)
    return torch.linalg.cholesky(g_ss + jitter * eye)


def nystrom_readout(
    x: Tensor,
    landmarks: Tensor,
    valid: Tensor,
    core: Core,
    v: Tensor,
    den_floor: float = 1e-6,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Query side: ``g(x, Z_S) core`` as a guarded ratio, in one log-sum-exp.

    ``g(x, s) e^{lambda_s} = e^{-|x|^2/2} exp(x.s - |s|^2/2 + lambda_s)``: the query factor is
    common to the numerator and the denominator, so it is dropped, and each row's maximum
    of the logits ``x.s - |s|^2/2 + lambda_s`` (with the core's log scales ``lambda``) is
    subtracted, as in a softmax. The denominator floor is relative to the size of the
    terms it sums, ``den_floor * sum_s a_s |c_s|`` with ``|c_s| = 1`` (the core's rows are
    scaled to size 1, :func:`solve_core`) - scale-free.

    Args:
        x: (..., n, d) query points.
        landmarks: (..., r, d), valid: (..., r) bool.
        core: from :func:`nystrom_core` (last column: weights).
        v: (..., m, d_v) values (for the value-hull guard).
        den_floor: relative denominator floor.

    Returns:
        out (..., n, d_v) and the guard counts of :func:`rpka.attention.guards.guarded_ratio`.
    """
    logits = landmark_logits(x, landmarks, valid) + core.log_scale.unsqueeze(-2)
    a = torch.exp(logits - finite_or_zero(logits.amax(-1, keepdim=True).detach()))  # row max 1
    full = a @ core.scaled  # (..., n, d_v + 1)
    tiny = torch.finfo(full.dtype).tiny  # keeps 0/0 out if every term vanished
    floor = (den_floor * a.sum(-1, keepdim=True)).clamp(min=tiny)  # sum_s a_s |c_s|, |c_s| = 1
    return guarded_ratio(full[..., :-1], full[..., -1:], floor, v)


def nystrom_softmax(
    q_s: Tensor,
    k_s: Tensor,
    v: Tensor,
    landmarks: Tensor,
    valid: Tensor,
    den_floor: float = 1e-6,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Guarded Nystrom estimate of ``softmax(q_s k_s^T) v`` on given landmarks.

    Args:
        q_s: (..., n, d) scaled queries ``q d^{-1/4}``.
        k_s: (..., m, d) scaled (and centred) keys.
        v: (..., m, d_v) values, same dtype as q_s.
        landmarks: (..., r, d) landmark points.
        valid: (..., r) bool; invalid landmarks are ignored.
        den_floor: relative floor of the denominator (guard 2).

    Returns:
        out (..., n, d_v) and guard counts (tensors): ``denominator`` rows floored,
        ``clamped`` output entries clamped, with totals ``rows`` and ``entries``.
    """
    core = nystrom_core(k_s, v, landmarks, valid)
    return nystrom_readout(q_s, landmarks, valid, core, v, den_floor)
