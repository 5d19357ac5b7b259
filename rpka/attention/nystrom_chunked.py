"""The Nystrom estimate for inference, streamed in chunks (:func:`nystrom_softmax_chunked`).

The estimate and its guards are :func:`rpka.attention.nystrom.nystrom_softmax`'s - the math,
and why each half runs in a log scale, is in ``nystrom.py``. This is the same estimate on a
selection's landmarks (:class:`PivotState`), without gradients, streamed so that the whole
sequence is never held as an (n x r) matrix nor as a scaled float32 (n x d) copy - at long
context those, not the output, would set peak memory:

* keys stream through the moments ``g(Z_S, K~) [w v, w]`` (r x (d_v + 1)) against a running
  maximum of the log terms per landmark, rescaled as in online softmax
  (:func:`_streamed_key_moments`, the chunked :func:`rpka.attention.nystrom.key_moments`);
* the small r x (d_v + 1) solve runs once, in float64
  (:func:`rpka.attention.nystrom.solve_graded`);
* queries stream through the readout logits into the output (:func:`_streamed_readout`,
  the chunked :func:`rpka.attention.nystrom.nystrom_readout`).

Chunks are cache-sized in float32 (:func:`rpka.attention.pivot_state.inference_chunk_bytes`);
float64 keeps the older, larger ones (its pinned GEMM rounds with the chunk's row count).
The key side may stay in float32 while the logits are moderate (``key_precision="auto"``,
:data:`KEY_LOGIT_LIMIT`); the streamed training path (``streamed.py``) shares that choice
(:func:`narrow_key_dtype`, :func:`too_sharp`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rpka.attention.guards import hull_tolerance, strictly_inside
from rpka.attention.nystrom import CORE_DTYPE, Core, finite_or_zero, solve_graded
from rpka.attention.pivot_state import PivotState, chunk_bounds, inference_chunk_bytes
from rpka.attention.rpcholesky import half_sq_norms

# The key side (nystrom_softmax_chunked here, nystrom_softmax_streamed for training):
# "float64" always widens the keys (the reference, and what every committed study ran);
# "auto" keeps them in the float32 compute dtype while every key-side logit reference
# |rho_s| stays within KEY_LOGIT_LIMIT nats and widens otherwise. Duplicated keys at logit
# std 1-16 (|rho| <= 55): float32 keys 3e-7 to 7e-7 relative error, float64 keys 2e-7 to
# 4e-7; std 25 and 36 (|rho| 85-124): float32 1e-6 to 1e-1, float64 <= 1e-6
# (docs/numerics.md, "The key side in float32"). The limit sits below the first failure by
# a factor 2.5.
KEY_PRECISIONS = ("auto", "float64")
KEY_LOGIT_LIMIT = 32.0


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
    rho, moments, v_range = _streamed_key_moments(k, v, k_scale, shift, state, row_bytes, key_dtype)
    if key_dtype != CORE_DTYPE and too_sharp(rho):  # widen: the float64 pass decides
        rho, moments, _ = _streamed_key_moments(k, v, k_scale, shift, state, row_bytes, CORE_DTYPE)
    # the selection's float32 factor is off by ~1e-5 where rows of the core differ by many
    # orders of magnitude: the small r x r factor is redone in float64 (landmark_cholesky)
    core = solve_graded(rho.squeeze(-2), moments, state.landmarks, state.valid, compute)
    out, counts = _streamed_readout(q, q_scale, v_range, state, core, den_floor, row_bytes)
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
    # non-finite references become 0, below the limit (one reduction, no boolean index)
    return rho.numel() > 0 and float(finite_or_zero(rho.detach()).abs().amax()) > KEY_LOGIT_LIMIT


def _per_batch(scale: float | Tensor, compute: torch.dtype) -> float | Tensor:
    """A scale as a number or a (B, 1, 1) tensor in the compute dtype."""
    return scale.to(compute).reshape(-1, 1, 1) if isinstance(scale, Tensor) else scale


def _scaled_copy(x: Tensor, scale: float | Tensor, compute: torch.dtype) -> Tensor:
    """``x * scale`` in the compute dtype: a fresh copy, never the input.

    Input already in the compute dtype: one multiply into a new tensor, the same bits as
    copying and then scaling in place, with one pass over the chunk instead of two.
    """
    if x.dtype == compute:
        return torch.mul(x, scale)
    return x.to(compute, copy=True).mul_(scale)


def _streamed_key_moments(
    k: Tensor,
    v: Tensor,
    k_scale: float | Tensor,
    shift: Tensor,
    state: PivotState,
    row_bytes: int,
    core_dtype: torch.dtype = CORE_DTYPE,
) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor]]:
    """:func:`key_moments` of the keys k (B, m, d), v (B, m, d_v) streamed in chunks.

    ``moments = g(Z_S, K~) [w v, w] = exp(s.k - |s|^2/2) [v, 1]`` against a running maximum
    ``rho`` per landmark, rescaled as in online softmax. Returns rho (B, 1, r) and moments
    (B, r, d_v + 1), in ``core_dtype`` (float64, or the compute dtype: :func:`narrow_key_dtype`),
    and the range of v, ``(min_j v_j, max_j v_j)`` (B, 1, d_v) each in v's dtype (the hull
    guard's): taken chunk by chunk while each chunk of v is in cache for ``[v, 1]``, instead
    of two more passes over the whole of v in the readout (min and max are exact, so the
    same values).
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
    v_min = v_max = None
    for start, stop in chunk_bounds(k.shape[-2], key_row_bytes, budget):
        # the same compute-dtype points the landmarks were taken from, then widened (if so)
        k_c = _scaled_copy(k[:, start:stop], k_scale, compute).sub_(shift).to(core_dtype)
        logits = torch.baddbmm(-lm_wide_half_sq, k_c, lm_wide.transpose(-1, -2))  # (B, c, r)
        new_rho = finite_or_zero(torch.maximum(rho, column_max(logits)))
        terms = logits.sub_(new_rho).exp_()
        v1 = torch.empty(*terms.shape[:-1], d_v + 1, dtype=core_dtype, device=k.device)
        v_c = v[:, start:stop]
        v1[..., :-1] = v_c  # [v, 1]: (B, c, d_v + 1)
        v1[..., -1:] = 1
        v_min, v_max = _running_range(v_c, v_min, v_max)
        rescale = torch.exp(rho - new_rho).transpose(-1, -2)  # (B, r, 1)
        moments = torch.baddbmm(moments * rescale, terms.transpose(-1, -2), v1)
        rho = new_rho
        del k_c, logits, terms, v1  # free this chunk before the next one is allocated
    return rho, moments, (v_min, v_max)


# column_max: rows are folded into this many columns before the reduction along them
FOLD_WIDTH = 64


def column_max(x: Tensor) -> Tensor:
    """``x.amax(-2, keepdim=True)`` for x (B, c, r), the same values, faster for narrow x.

    PyTorch's CPU reduction along the rows runs vectorised for rows of 32 or 64 floats
    but ~18x slower per entry for 16 (0.22 vs 0.012 ms for (8, 820, 16), one thread,
    issue 39: the key side at rank 16). Rows are folded ``g = 64 / r`` at a time into
    (B, c / g, 64) - a view of contiguous x - reduced, then the g groups reduced; a max is
    exact, so the order does not matter. Rows left over by the fold are reduced apart.
    """
    batch, rows, width = x.shape
    group = FOLD_WIDTH // width if width < FOLD_WIDTH and FOLD_WIDTH % width == 0 else 1
    body = rows - rows % group
    if group == 1 or body == 0 or not x.is_contiguous():
        return x.amax(-2, keepdim=True)
    folded = x[:, :body].reshape(batch, body // group, group * width).amax(-2, keepdim=True)
    out = folded.reshape(batch, group, width).amax(-2, keepdim=True)
    if body < rows:
        out = torch.maximum(out, x[:, body:].amax(-2, keepdim=True))
    return out


def _running_range(x: Tensor, low: Tensor | None, high: Tensor | None) -> tuple[Tensor, Tensor]:
    """The range of x (B, c, d) along its rows (B, 1, d), merged into the running one."""
    x_low, x_high = x.amin(-2, keepdim=True), x.amax(-2, keepdim=True)
    if low is None or high is None:
        return x_low, x_high
    return torch.minimum(low, x_low), torch.maximum(high, x_high)


def _streamed_readout(
    q: Tensor,
    q_scale: float | Tensor,
    v_range: tuple[Tensor, Tensor],
    state: PivotState,
    core: Core,
    den_floor: float,
    row_bytes: int,
) -> tuple[Tensor, dict[str, Tensor]]:
    """:func:`nystrom_readout` of the queries q (B, n, d) streamed in chunks, guarded.

    ``out = a core[:, :d_v] / a core[:, d_v]`` with ``a = g(Q~, Z_S) e^{lambda}`` up to each
    row's common factor, in one log-sum-exp; guard 2 relative to the terms, guard 3 the
    hull of v, ``v_range = (min_j v_j, max_j v_j)`` (B, 1, d_v) each. Returns out
    (B, n, d_v) in q's dtype and the guard counts.
    """
    compute, landmarks = state.landmarks.dtype, state.landmarks
    n, d_v = q.shape[-2], v_range[0].shape[-1]
    lm_half_sq = half_sq_norms(landmarks, state.valid)  # (B, 1, r), +inf masks unused slots
    v_min, v_max = (x.to(compute) for x in v_range)
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
        den = torch.where(low, floor, den)
        # the ratio straight into the output where it has the compute dtype (one pass, no
        # copy); in place otherwise (one (B, c, d_v + 1) buffer), then cast into the output
        o = out[:, start:stop] if out.dtype == compute else num
        torch.div(num, den, out=o)
        low_count.append(low.sum())
        if strictly_inside(o, v_min, v_max):  # two reductions: the usual, idle case
            clamped_count.append(torch.zeros((), dtype=torch.int64, device=q.device))
        else:
            clamped_count.append(((o < v_min - hull_tol) | (o > v_max + hull_tol)).sum())
            o.clamp_(v_min, v_max)
        if o is num:  # the clamp would be the identity when strictly inside
            out[:, start:stop] = o
        del q_c, logits, a, full, floor, num, den, o, low
    counts = {
        "denominator": torch.stack(low_count).sum(),
        "rows": torch.tensor(q.shape[0] * n),
        "clamped": torch.stack(clamped_count).sum(),
        "entries": torch.tensor(q.shape[0] * n * d_v),
    }
    return out, counts
