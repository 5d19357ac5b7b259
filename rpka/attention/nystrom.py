"""The Nystrom estimate of softmax attention on given landmarks: key-side core, query-side
readout, and the streamed (chunked) inference pass. Shared by ``rpka.py``, ``causal.py``
and ``keys_coreset.py``.

With ``q~ = q d^{-1/4}``, ``k~ = k d^{-1/4}``, ``exp(q~.k~) = e^{|q~|^2/2} e^{|k~|^2/2} g(q~, k~)``
with the Gaussian ``g``; the query factor cancels in the softmax, the key factor is a
weight ``w_j``, and ``g`` is replaced by ``G_QS G_SS^{-1} G_SK`` on landmarks ``Z_S``:

    out = G_QS G_SS^{-1} G_SK (w * V) / G_QS G_SS^{-1} G_SK w          (DESIGN.md section 2)
"""

from __future__ import annotations

import torch
from torch import Tensor

from rpka.attention.accelerated import PivotState, chunk_bounds
from rpka.attention.guards import guarded_ratio
from rpka.attention.rpcholesky import gaussian_kernel, gaussian_kernel_, half_sq_norms


def gather_points(points: Tensor, index: Tensor) -> Tensor:
    """points (..., N, d), index (..., r) with -1 for none -> (..., r, d) (zeros for -1)."""
    safe = index.clamp(min=0)
    out = torch.gather(points, -2, safe.unsqueeze(-1).expand(*safe.shape, points.shape[-1]))
    return out * (index >= 0).unsqueeze(-1).to(points.dtype)


def nystrom_core(k_s: Tensor, v: Tensor, landmarks: Tensor, valid: Tensor) -> Tensor:
    """Key side of the Nystrom estimate: ``G_SS^{-1} G_SK [w * V, w]``, (..., r, d_v + 1).

    Args:
        k_s: (..., m, d) scaled (and centred) keys.
        v: (..., m, d_v) values, same dtype as k_s.
        landmarks: (..., r, d) landmark points.
        valid: (..., r) bool; invalid landmarks are ignored (their rows of the core are 0).

    The last column carries the key weights ``w_j = exp(|k_j|^2/2 - max)`` (log domain,
    max 1): the key factor ``e^{|k|^2/2}`` of ``exp(q.k)``.
    """
    g_ks = gaussian_kernel(k_s, landmarks) * valid.to(k_s.dtype).unsqueeze(-2)  # (..., m, r)
    chol = landmark_cholesky(landmarks, valid)

    log_w = k_s.pow(2).sum(-1) / 2  # e^{|k~|^2/2}, in the log domain
    w = torch.exp(log_w - log_w.amax(-1, keepdim=True))  # (..., m), max 1
    wv = torch.cat([w.unsqueeze(-1) * v, w.unsqueeze(-1)], dim=-1)  # (..., m, d_v + 1)
    rhs = (g_ks.transpose(-1, -2) @ wv).to(chol.dtype)
    return torch.cholesky_solve(rhs, chol).to(k_s.dtype)  # (..., r, d_v + 1)


def landmark_cholesky(landmarks: Tensor, valid: Tensor) -> Tensor:
    """Cholesky factor of ``G_SS + jitter I`` (..., r, r), always in float64.

    The block is tiny (r x r), and in float32 a Gram of pivots whose residuals were near
    round-off can lose definiteness to rounding (seen in training at r = 64 of 192 points).
    The jitter is that of the input precision (10 eps), so float32 and float64 inputs keep
    their own accuracy; invalid landmarks get identity rows.
    """
    lm = landmarks.to(torch.float64)
    eye = torch.eye(lm.shape[-2], dtype=torch.float64, device=lm.device)
    pair = valid.unsqueeze(-1) & valid.unsqueeze(-2)
    g_ss = torch.where(pair, gaussian_kernel(lm, lm), eye)
    jitter = 10 * torch.finfo(landmarks.dtype).eps
    return torch.linalg.cholesky(g_ss + jitter * eye)


def nystrom_readout(
    x: Tensor,
    landmarks: Tensor,
    valid: Tensor,
    core: Tensor,
    v: Tensor,
    den_floor: float = 1e-6,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Query side: ``g(x, Z_S) core`` as a guarded ratio, computed in the log domain.

    ``g(x, s) = e^{-|x|^2/2} exp(x.s - |s|^2/2)``: the query factor is common to the
    numerator and the denominator, so it is dropped, and so is each row's maximum of
    ``x.s - |s|^2/2`` (as in a softmax). Nothing underflows however large |x| is, and the
    denominator floor is relative to the size of the terms it sums,
    ``den_floor * sum_s a_s |c_s|`` - scale-free, unlike a floor tied to ``sum_j w_j``,
    which the exact denominator undercuts by ``e^{-|x|^2/2}``-like factors.

    Args:
        x: (..., n, d) query points.
        landmarks: (..., r, d), valid: (..., r) bool.
        core: (..., r, d_v + 1) from :func:`nystrom_core` (last column: weights).
        v: (..., m, d_v) values (for the value-hull guard).
        den_floor: relative denominator floor.

    Returns:
        out (..., n, d_v) and the guard counts of :func:`rpka.attention.guards.guarded_ratio`.
    """
    logits = x @ landmarks.transpose(-1, -2) - landmarks.pow(2).sum(-1).unsqueeze(-2) / 2
    logits = logits.masked_fill(~valid.unsqueeze(-2), float("-inf"))  # (..., n, r)
    a = torch.exp(logits - logits.amax(-1, keepdim=True).detach())  # max 1 per row
    full = a @ core  # (..., n, d_v + 1)
    tiny = torch.finfo(core.dtype).tiny  # keeps 0/0 out if every term vanished
    floor = (den_floor * (a @ core[..., -1:].abs())).clamp(min=tiny)
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
    scale: float,
    key_shift: Tensor,
    den_floor: float = 1e-6,
) -> tuple[Tensor, dict[str, Tensor]]:
    """:func:`nystrom_softmax` for inference: chunked, on the selection's own factor.

    Same estimate and guards, but (i) it reuses the pivot selection's Cholesky factor
    ``L`` of ``G(Z_S, Z_S)`` instead of rebuilding it, (ii) it never holds an (n x r) or an
    (n x d) float32 copy of the whole sequence: keys stream through
    ``F_K^T [w v, w]`` (r x (d_v + 1)) with a running max of the log weights (rescaled as
    in online softmax), then queries stream through ``F_Q`` into the output. Peak memory is
    the output plus a few chunk-sized buffers (``FAST.chunk_bytes`` each).

    Args:
        q: (B, H, n, d), k: (B, H, m, d), v: (B, H, m, d_v), any float dtype.
        state: pivots of the scaled points (batch flattened to B*H), from
            :func:`accelerated_pivots` on ``[q * scale; k * scale - key_shift]`` or keys.
        scale: ``d^{-1/4}``; key_shift: (B, H, 1, d) the mean of the scaled keys.

    Returns:
        out (B, H, n, d_v) in q's dtype and the guard counts (as :func:`nystrom_softmax`).
    """
    compute = state.landmarks.dtype
    batch_shape, n, m, d_v = q.shape[:-2], q.shape[-2], k.shape[-2], v.shape[-1]
    q, k, v = (x.reshape(-1, x.shape[-2], x.shape[-1]) for x in (q, k, v))
    shift = key_shift.to(compute).reshape(-1, 1, k.shape[-1])
    landmarks, rank = state.landmarks, state.rank
    lm_half_sq = half_sq_norms(landmarks, state.valid)  # (B, 1, r), +inf masks unused slots
    row_bytes = q.shape[0] * max(rank, d_v + 1, q.shape[-1]) * torch.finfo(compute).bits // 8

    def scaled(x: Tensor) -> Tensor:  # a fresh float copy (never the input itself)
        return x.to(compute, copy=True).mul_(scale)

    # keys: acc = g(K~, Z_S)^T [w v, w] with w = e^{|k~|^2/2 - max}, max kept running
    acc = q.new_zeros(q.shape[0], rank, d_v + 1, dtype=compute)
    run_max = q.new_full((q.shape[0], 1, 1), float("-inf"), dtype=compute)
    for start, stop in chunk_bounds(m, row_bytes):
        k_c = scaled(k[:, start:stop]).sub_(shift)
        half_sq = k_c.pow(2).sum(-1, keepdim=True) / 2  # (B, c, 1): log w before the max
        g_ks = gaussian_kernel_(k_c, landmarks, half_sq, lm_half_sq)  # (B, c, r)
        new_max = torch.maximum(run_max, half_sq.amax(-2, keepdim=True))
        w = half_sq.sub_(new_max).exp_()
        wv = torch.empty(*w.shape[:-1], d_v + 1, dtype=compute, device=w.device)
        torch.mul(v[:, start:stop], w, out=wv[..., :-1])  # [w v, w]: (B, c, d_v + 1)
        wv[..., -1:] = w
        rescale = torch.exp(run_max - new_max)
        acc = torch.baddbmm(acc * rescale, g_ks.transpose(-1, -2), wv)
        run_max = new_max
        del k_c, g_ks, wv, w  # free this chunk before the next one is allocated
    core = torch.cholesky_solve(acc, state.chol)  # G_SS^{-1} g_SK [w v, w]: (B, r, d_v + 1)

    # queries: out = a core[:, :d_v] / a core[:, d_v] with a = g(Q~, Z_S) up to each row's
    # common factor, in the log domain as in nystrom_readout; guard 2 relative to the terms
    v_min = v.amin(-2, keepdim=True).to(compute)
    v_max = v.amax(-2, keepdim=True).to(compute)
    core_abs_w = core[..., -1:].abs()
    tiny = torch.finfo(compute).tiny
    out = torch.empty(q.shape[0], n, d_v, dtype=q.dtype, device=q.device)
    low_count, clamped_count = [], []
    for start, stop in chunk_bounds(n, row_bytes):
        logits = torch.baddbmm(-lm_half_sq, scaled(q[:, start:stop]), landmarks.transpose(-1, -2))
        a = logits.sub_(logits.amax(-1, keepdim=True)).exp_()  # (B, c, r), row max 1
        full = a @ core
        floor = (a @ core_abs_w).mul_(den_floor).clamp_(min=tiny)
        num, den = full[..., :-1], full[..., -1:]
        low = den < floor
        o = num.div_(torch.where(low, floor, den))  # in place: one (B, c, d_v + 1) buffer
        low_count.append(low.sum())
        clamped_count.append(((o < v_min) | (o > v_max)).sum())
        out[:, start:stop] = o.clamp_(v_min, v_max)
        del logits, a, full, floor, num, den, o, low
    low_total, clamped_total = torch.stack(low_count).sum(), torch.stack(clamped_count).sum()
    counts = {
        "denominator": low_total,
        "rows": torch.tensor(q.shape[0] * n),
        "clamped": clamped_total,
        "entries": torch.tensor(q.shape[0] * n * d_v),
    }
    return out.reshape(*batch_shape, n, d_v), counts
