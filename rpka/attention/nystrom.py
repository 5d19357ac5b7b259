"""The Nystrom estimate of softmax attention on given landmarks: key-side core, query-side
readout, and the streamed (chunked) inference pass. Shared by ``rpka.py``, ``causal.py``
and ``keys_coreset.py``.

With ``q~ = q d^{-1/4}``, ``k~ = k d^{-1/4}``, ``exp(q~.k~) = e^{|q~|^2/2} e^{|k~|^2/2} g(q~, k~)``
with the Gaussian ``g``; the query factor cancels in the softmax, the key factor is a
weight ``w_j``, and ``g`` is replaced by ``G_QS G_SS^{-1} G_SK`` on landmarks ``Z_S``:

    out = G_QS G_SS^{-1} G_SK (w * V) / G_QS G_SS^{-1} G_SK w          (docs/design.md section 2)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from rpka.attention.guards import guarded_ratio, hull_tolerance, strictly_inside
from rpka.attention.pivot_state import PivotState, chunk_bounds, inference_chunk_bytes
from rpka.attention.rpcholesky import gaussian_kernel, half_sq_norms

# the key side (moments and the r x (d_v + 1) solve) runs in float64 whatever the input
# dtype: see key_moments; the readout stays in the compute dtype (float32 or float64)
CORE_DTYPE = torch.float64
SIZE_FLOOR = torch.finfo(CORE_DTYPE).tiny ** 0.5  # ~1e-154 (see solve_core)
# Inference key side (nystrom_softmax_chunked): "float64" always widens the keys (the
# reference, and what every committed study ran); "auto" keeps them in the float32 compute
# dtype while every key-side logit reference |rho_s| stays within KEY_LOGIT_LIMIT nats and
# widens otherwise. Duplicated keys at logit std 1-16 (|rho| <= 55): float32 keys 3e-7 to
# 7e-7 relative error, float64 keys 2e-7 to 4e-7; std 25 and 36 (|rho| 85-124): float32
# 1e-6 to 1e-1, float64 <= 1e-6 (docs/numerics.md, "The key side in float32"). The limit
# sits below the first failure by a factor 2.5.
KEY_PRECISIONS = ("auto", "float64")
KEY_LOGIT_LIMIT = 32.0


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


def finite_or_zero(x: Tensor) -> Tensor:
    """A log reference: -inf (nothing to refer to) becomes 0, so ``x - ref`` stays -inf."""
    return torch.where(torch.isfinite(x), x, torch.zeros_like(x))


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
    rho, moments = rho.to(CORE_DTYPE), moments.to(CORE_DTYPE)
    top = rho.amax(-1, keepdim=True)  # (..., 1)
    rhs = moments * torch.exp(rho - top).unsqueeze(-1)
    core = torch.cholesky_solve(rhs, chol.to(CORE_DTYPE))  # (..., r, d_v + 1)
    # Any positive size per row is exact (it moves between lambda and the row). The size of
    # a row, |c_s| = max(|weight entry|, 2^-20 |largest entry|), is rescaled to 1: the
    # denominator's terms are then a_s (+-1) and the relative floor den_floor * sum_s a_s
    # |c_s| = den_floor * sum_s a_s >= den_floor (the row maximum of a is 1), and no entry
    # exceeds 2^20, so no gradient overflows. A row more than ~350 nats below the top one
    # keeps a smaller size (SIZE_FLOOR), likewise.
    magnitude = core.detach().abs()
    largest = magnitude.amax(-1, keepdim=True)
    live = largest > 0
    size = torch.maximum(magnitude[..., -1:], largest * 2.0**-20).clamp(min=SIZE_FLOOR)
    log_scale = torch.where(live, size.log(), float("-inf")).squeeze(-1) + top
    return Core((core / size).to(dtype), log_scale.to(dtype))


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
    eye = torch.eye(lm.shape[-2], dtype=torch.float64, device=lm.device)
    pair = valid.unsqueeze(-1) & valid.unsqueeze(-2)
    g_ss = torch.where(pair, gaussian_kernel(lm, lm), eye)
    jitter = 10 * torch.finfo(torch.float64).eps
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


@torch.no_grad()
def nystrom_softmax_chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    state: PivotState,
    q_scale: float | Tensor,
    k_scale: float | Tensor,
    key_shift: Tensor,
    den_floor: float = 1e-6,
    key_precision: str = "float64",
) -> tuple[Tensor, dict[str, Tensor]]:
    """:func:`nystrom_softmax` for inference: chunked, on the selection's landmarks.

    Same estimate and guards, but it never holds an (n x r) or an (n x d) float32 copy of
    the whole sequence: keys stream through the moments ``g(Z_S, K~) [w v, w]``
    (r x (d_v + 1)) with a running maximum of the log terms per landmark (rescaled as in
    online softmax, :func:`key_moments`), then queries stream through the readout logits
    into the output. Peak memory is the output plus a few chunk-sized buffers
    (:func:`inference_chunk_bytes` each: the training path's cache-sized budget on a CPU).

    Args:
        q: (B, H, n, d), k: (B, H, m, d), v: (B, H, m, d_v), any float dtype.
        state: pivots of the scaled points (batch flattened to B*H), from
            :func:`accelerated_pivots` on ``[q * q_scale; k * k_scale - key_shift]`` or keys.
        q_scale, k_scale: the scales of queries and keys, numbers or (B, H, 1, 1) tensors
            (``d^{-1/4}`` times the q/k balance of :func:`rpka.attention.frame.balanced_frame`);
        key_shift: (B, H, 1, d) the mean of the scaled keys.
        key_precision: ``"float64"`` (the key side widened, :func:`key_moments`) or
            ``"auto"`` (in the compute dtype while the logits are moderate, see
            :data:`KEY_LOGIT_LIMIT` and :func:`narrow_key_dtype`).

    Returns:
        out (B, H, n, d_v) in q's dtype and the guard counts (as :func:`nystrom_softmax`).
    """
    compute = state.landmarks.dtype
    batch_shape, n, d_v = q.shape[:-2], q.shape[-2], v.shape[-1]
    q, k, v = (x.reshape(-1, x.shape[-2], x.shape[-1]) for x in (q, k, v))
    shift = key_shift.to(compute).reshape(-1, 1, k.shape[-1])
    row_bytes = q.shape[0] * max(state.rank, d_v + 1, q.shape[-1]) * torch.finfo(compute).bits // 8
    q_scale, k_scale = _per_batch(q_scale, compute), _per_batch(k_scale, compute)
    key_dtype = narrow_key_dtype(key_precision, state.landmarks, state.valid)
    rho, moments = _streamed_key_moments(k, v, k_scale, shift, state, row_bytes, key_dtype)
    if key_dtype != CORE_DTYPE and too_sharp(rho):  # widen: the float64 pass decides
        rho, moments = _streamed_key_moments(k, v, k_scale, shift, state, row_bytes, CORE_DTYPE)
    # the selection's float32 factor is off by ~1e-5 where rows of the core differ by many
    # orders of magnitude: the small r x r factor is redone in float64 (landmark_cholesky)
    core = solve_graded(rho.squeeze(-2), moments, state.landmarks, state.valid, compute)
    out, counts = _streamed_readout(q, q_scale, v, state, core, den_floor, row_bytes)
    return out.reshape(*batch_shape, n, d_v), counts


def narrow_key_dtype(key_precision: str, landmarks: Tensor, valid: Tensor) -> torch.dtype:
    """The dtype a key side (moments) is first computed in: float64, or with ``"auto"`` the
    landmarks' compute dtype unless their size already shows logits past the limit.

    A key landmark ``s`` sees itself, ``rho_s >= s.s - |s|^2/2 = |s|^2/2``, so with a half
    squared norm past :data:`KEY_LOGIT_LIMIT` the narrow pass would be redone; a query
    landmark that large is taken the same way (float64 is the reference, never the risk).
    Otherwise the narrow pass runs and its references decide (:func:`too_sharp`).
    landmarks (B, r, d), valid (B, r).
    """
    compute = landmarks.dtype
    if key_precision == "float64" or compute == CORE_DTYPE:
        return CORE_DTYPE
    self_reference = landmarks.detach().pow(2).sum(-1).div(2).masked_fill(~valid, 0)
    return compute if bool((self_reference <= KEY_LOGIT_LIMIT).all()) else CORE_DTYPE


def too_sharp(rho: Tensor) -> bool:
    """Whether a narrow key pass must be redone in float64: some valid landmark's logit
    reference ``|rho_s|`` (rho (B, ..., r), -inf or 0 where unused) exceeds the limit."""
    finite = rho.detach()[torch.isfinite(rho)]
    return bool(finite.numel()) and float(finite.abs().amax()) > KEY_LOGIT_LIMIT


def _per_batch(scale: float | Tensor, compute: torch.dtype) -> float | Tensor:
    """A scale as a number or a (B, 1, 1) tensor in the compute dtype."""
    return scale.to(compute).reshape(-1, 1, 1) if isinstance(scale, Tensor) else scale


def _scaled_copy(x: Tensor, scale: float | Tensor, compute: torch.dtype) -> Tensor:
    """``x * scale`` in the compute dtype: a fresh copy, never the input."""
    return x.to(compute, copy=True).mul_(scale)


def _streamed_key_moments(
    k: Tensor,
    v: Tensor,
    k_scale: float | Tensor,
    shift: Tensor,
    state: PivotState,
    row_bytes: int,
    core_dtype: torch.dtype = CORE_DTYPE,
) -> tuple[Tensor, Tensor]:
    """:func:`key_moments` of the keys k (B, m, d), v (B, m, d_v) streamed in chunks.

    ``moments = g(Z_S, K~) [w v, w] = exp(s.k - |s|^2/2) [v, 1]`` against a running maximum
    ``rho`` per landmark, rescaled as in online softmax. Returns rho (B, 1, r) and moments
    (B, r, d_v + 1), in ``core_dtype`` (float64, or the compute dtype: :func:`narrow_key_dtype`).
    """
    compute, rank, d_v = state.landmarks.dtype, state.rank, v.shape[-1]
    moments = k.new_zeros(k.shape[0], rank, d_v + 1, dtype=core_dtype)
    rho = k.new_full((k.shape[0], 1, rank), float("-inf"), dtype=core_dtype)
    lm_wide = state.landmarks.to(core_dtype)
    lm_wide_half_sq = half_sq_norms(lm_wide, state.valid)  # not the rounded float32 norms
    key_row_bytes = row_bytes * torch.finfo(core_dtype).bits // torch.finfo(compute).bits
    # float64 keys summed in other chunks move a float64 estimate by ~1e-15 (the online
    # rescale and the sum order); rounded to a float32 core they did not move at all
    # (tests/test_attention.py): small chunks only where the output stays bitwise the same
    budget = inference_chunk_bytes(k.device) if compute == torch.float32 else None
    for start, stop in chunk_bounds(k.shape[-2], key_row_bytes, budget):
        # the same compute-dtype points the landmarks were taken from, then widened (if so)
        k_c = _scaled_copy(k[:, start:stop], k_scale, compute).sub_(shift).to(core_dtype)
        logits = torch.baddbmm(-lm_wide_half_sq, k_c, lm_wide.transpose(-1, -2))  # (B, c, r)
        new_rho = finite_or_zero(torch.maximum(rho, logits.amax(-2, keepdim=True)))
        terms = logits.sub_(new_rho).exp_()
        v1 = torch.empty(*terms.shape[:-1], d_v + 1, dtype=core_dtype, device=k.device)
        v1[..., :-1] = v[:, start:stop]  # [v, 1]: (B, c, d_v + 1)
        v1[..., -1:] = 1
        rescale = torch.exp(rho - new_rho).transpose(-1, -2)  # (B, r, 1)
        moments = torch.baddbmm(moments * rescale, terms.transpose(-1, -2), v1)
        rho = new_rho
        del k_c, logits, terms, v1  # free this chunk before the next one is allocated
    return rho, moments


def _streamed_readout(
    q: Tensor,
    q_scale: float | Tensor,
    v: Tensor,
    state: PivotState,
    core: Core,
    den_floor: float,
    row_bytes: int,
) -> tuple[Tensor, dict[str, Tensor]]:
    """:func:`nystrom_readout` of the queries q (B, n, d) streamed in chunks, guarded.

    ``out = a core[:, :d_v] / a core[:, d_v]`` with ``a = g(Q~, Z_S) e^{lambda}`` up to each
    row's common factor, in one log-sum-exp; guard 2 relative to the terms, guard 3 the
    hull of v (B, m, d_v). Returns out (B, n, d_v) in q's dtype and the guard counts.
    """
    compute, landmarks = state.landmarks.dtype, state.landmarks
    n, d_v = q.shape[-2], v.shape[-1]
    lm_half_sq = half_sq_norms(landmarks, state.valid)  # (B, 1, r), +inf masks unused slots
    v_min = v.amin(-2, keepdim=True).to(compute)
    v_max = v.amax(-2, keepdim=True).to(compute)
    hull_tol = hull_tolerance(v_min, v_max)
    bias = core.log_scale.unsqueeze(-2) - lm_half_sq  # (B, 1, r), -inf on unused slots
    tiny = torch.finfo(compute).tiny
    out = torch.empty(q.shape[0], n, d_v, dtype=q.dtype, device=q.device)
    low_count, clamped_count = [], []
    # float32 in cache-sized chunks; float64 in the old one: MKL's pinned (CBWR) float64 GEMM
    # rounds differently with the chunk's row count, float32's does not (tests/test_attention)
    budget = inference_chunk_bytes(q.device) if compute == torch.float32 else None
    for start, stop in chunk_bounds(n, row_bytes, budget):
        q_c = _scaled_copy(q[:, start:stop], q_scale, compute)
        logits = torch.baddbmm(bias, q_c, landmarks.transpose(-1, -2))
        a = logits.sub_(finite_or_zero(logits.amax(-1, keepdim=True))).exp_()  # row max 1
        full = a @ core.scaled
        floor = a.sum(-1, keepdim=True).mul_(den_floor).clamp_(min=tiny)
        num, den = full[..., :-1], full[..., -1:]
        low = den < floor
        o = num.div_(torch.where(low, floor, den))  # in place: one (B, c, d_v + 1) buffer
        low_count.append(low.sum())
        if strictly_inside(o, v_min, v_max):  # two reductions: the usual, idle case
            clamped_count.append(torch.zeros((), dtype=torch.int64, device=q.device))
            out[:, start:stop] = o  # the clamp would be the identity
        else:
            clamped_count.append(((o < v_min - hull_tol) | (o > v_max + hull_tol)).sum())
            out[:, start:stop] = o.clamp_(v_min, v_max)
        del q_c, logits, a, full, floor, num, den, o, low
    counts = {
        "denominator": torch.stack(low_count).sum(),
        "rows": torch.tensor(q.shape[0] * n),
        "clamped": torch.stack(clamped_count).sum(),
        "entries": torch.tensor(q.shape[0] * n * d_v),
    }
    return out, counts
