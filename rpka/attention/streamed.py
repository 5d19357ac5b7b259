"""The differentiable Nystrom estimate, streamed: O(n d) memory held for backward (issue 16).

:func:`rpka.attention.nystrom.nystrom_softmax` under autograd keeps about ten (n x r)
matrices per call for backward (the key logits and terms in float64, the readout logits
and weights in float32, masks) and makes a fresh (n x r) buffer per elementwise op. On a
CPU those buffers dominate a training step at long context (profile: docs/speed.md):
each op streams tens of MiB through memory instead of cache, and the saved matrices set
the step's peak memory.

:func:`nystrom_softmax_streamed` computes the same estimate with two custom autograd
functions, one per (n x r) stage:

* :class:`KeyMoments`: ``rho, G_SK [w v, w]`` (:func:`rpka.attention.nystrom.key_moments`,
  float64);
* :class:`Readout`: ``a core`` and ``sum_s a_s`` with ``a = exp(logits - row max)``
  (:func:`rpka.attention.nystrom.nystrom_readout` before its guards).

Each runs over groups of batch elements whose (rows x r) buffers fit ``STREAM_BYTES``
(cache-sized, reused in place), saves only its (n x d) inputs, and recomputes the (n x r)
weights group by group in backward (as FlashAttention recomputes its scores). The forward
is the reference's op sequence per group; the backward is the chain rule of that sequence
written out (exp: ``grad * result``; masked_fill: the mask's entries get 0; the landmark
norm ``|s|^2/2``: ``-colsum(grad) s``). The small r x r core (Cholesky, solve, sizes) and the
(n x d_v) guards stay under autograd.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx

from rpka.attention.guards import guarded_ratio
from rpka.attention.nystrom import CORE_DTYPE, finite_or_zero, solve_graded
from rpka.attention.nystrom_chunked import narrow_key_dtype, too_sharp
from rpka.attention.pivot_state import STREAM_BYTES, STREAM_BYTES_OTHER


def batch_groups(batch: int, item_bytes: int, device: torch.device) -> list[slice]:
    """Split ``batch`` elements into consecutive groups whose buffers fit the device's
    ``STREAM_BYTES`` (at least one element per group)."""
    budget = STREAM_BYTES.get(device.type, STREAM_BYTES_OTHER)
    size = max(1, budget // max(item_bytes, 1))
    return [slice(start, min(start + size, batch)) for start in range(0, batch, size)]


def _flat(x: Tensor) -> Tensor:
    return x.reshape(-1, *x.shape[-2:])


def _logits(x: Tensor, landmarks: Tensor, valid: Tensor | None) -> Tensor:
    """:func:`rpka.attention.nystrom.landmark_logits` in place; ``valid=None``: all valid."""
    logits = (x @ landmarks.transpose(-1, -2)).sub_(landmarks.pow(2).sum(-1).unsqueeze(-2) / 2)
    return logits if valid is None else logits.masked_fill_(~valid.unsqueeze(-2), float("-inf"))


def _mask_or_none(valid: Tensor) -> Tensor | None:
    """``valid``, or None when it is all True (the common case: masking is then a no-op)."""
    return None if bool(valid.all()) else valid


def _zero_invalid_(grad_logits: Tensor, valid: Tensor | None) -> Tensor:
    """The gradient of masked_fill: 0 at the masked (invalid) landmarks."""
    return grad_logits if valid is None else grad_logits.masked_fill_(~valid.unsqueeze(-2), 0.0)


def _bmm_into(out: Tensor, a: Tensor, b: Tensor) -> None:
    """``out[...] = a @ b`` for 3-d a, b: the product written into ``out`` (a batch slice of a
    result) without a temporary where the dtypes agree, else narrowed into it as ``=`` does."""
    if out.dtype == a.dtype == b.dtype:
        torch.bmm(a, b, out=out)
    else:
        out.copy_(a @ b)


def _landmark_norm_grad(grad_logits: Tensor, landmarks: Tensor) -> Tensor:
    """Gradient through ``- |s|^2 / 2`` of :func:`landmark_logits`: ``-colsum(grad) s``."""
    return -grad_logits.sum(-2).unsqueeze(-1) * landmarks


class KeyMoments(torch.autograd.Function):
    """``(rho, moments)`` of :func:`rpka.attention.nystrom.key_moments`, streamed.

    Inputs k (B, m, d), v (B, m, d_v) in any float dtype, landmarks (B, r, d) in
    ``CORE_DTYPE``, valid (B, r). k and v are widened to ``CORE_DTYPE`` group by group (the
    same values as widening them whole, without holding float64 copies for backward).
    ``rho`` (B, r) is a detached reference (no gradient), as in the reference.
    """

    @staticmethod
    def forward(ctx: FunctionCtx, k: Tensor, v: Tensor, landmarks: Tensor, valid: Tensor):
        batch, m, rank = k.shape[0], k.shape[-2], landmarks.shape[-2]
        rho = landmarks.new_empty(batch, rank)
        moments = landmarks.new_empty(batch, rank, v.shape[-1] + 1)
        mask = _mask_or_none(valid)
        for g in batch_groups(batch, m * rank * landmarks.element_size(), k.device):
            k_g, v1 = KeyMoments._widened(k[g], v[g], landmarks.dtype)
            logits = _logits(k_g, landmarks[g], None if mask is None else mask[g])  # (b, m, r)
            rho[g] = finite_or_zero(logits.amax(-2))
            terms = logits.sub_(rho[g].unsqueeze(-2)).exp_()
            moments[g] = terms.transpose(-1, -2) @ v1
        ctx.save_for_backward(k, v, landmarks, valid, rho)
        ctx.mark_non_differentiable(rho)
        return rho, moments

    @staticmethod
    def _widened(k: Tensor, v: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """k and ``[v, 1]`` of one group in ``dtype``."""
        v = v.to(dtype)
        return k.to(dtype), torch.cat([v, torch.ones_like(v[..., :1])], -1)

    @staticmethod
    def backward(ctx: FunctionCtx, _grad_rho: Tensor, grad_moments: Tensor):
        k, v, landmarks, valid, rho = ctx.saved_tensors
        grad_k, grad_v = torch.empty_like(k), torch.empty_like(v)
        grad_lm = torch.empty_like(landmarks)
        mask = _mask_or_none(valid)
        item_bytes = k.shape[-2] * landmarks.shape[-2] * landmarks.element_size()
        for g in batch_groups(k.shape[0], item_bytes, k.device):
            mask_g = None if mask is None else mask[g]
            k_g, v1 = KeyMoments._widened(k[g], v[g], landmarks.dtype)
            terms = _logits(k_g, landmarks[g], mask_g).sub_(rho[g].unsqueeze(-2)).exp_()
            grad_v[g] = (terms @ grad_moments[g])[..., :-1]  # narrowed as .to() would
            grad_logits = (grad_moments[g] @ v1.transpose(-1, -2)).transpose(-1, -2).mul_(terms)
            grad_logits = _zero_invalid_(grad_logits, mask_g)
            _bmm_into(grad_k[g], grad_logits, landmarks[g])
            grad_lm[g] = (k_g.transpose(-1, -2) @ grad_logits).transpose(-1, -2)
            grad_lm[g] += _landmark_norm_grad(grad_logits, landmarks[g])
        return grad_k, grad_v, grad_lm, None


class Readout(torch.autograd.Function):
    """``(a core, sum_s a_s)`` of :func:`rpka.attention.nystrom.nystrom_readout`, streamed.

    Inputs x (B, n, d), landmarks (B, r, d), valid (B, r), log_scale (B, r) (the core's
    detached log scales), core (B, r, p). ``a = exp(logits - row max)`` with
    ``logits = x.s - |s|^2/2 + log_scale`` (-inf on invalid landmarks); returns
    ``full = a @ core`` (B, n, p) as its numerator and denominator, the views
    ``full[..., :-1]`` and ``full[..., -1:]``, and ``a.sum(-1)`` (B, n, 1).

    Two views and not ``full``: autograd would give each slice of ``full`` a gradient of
    full size, zeros but for the slice, and add the two (2 fills, 2 copies and an add of
    (n x p) per call); backward here writes the two parts into one buffer instead, then
    adds 0.0 as that sum did (``-0.0 + 0.0`` is ``+0.0``): the same bits.
    """

    @staticmethod
    def _weights(x: Tensor, landmarks: Tensor, valid: Tensor | None, log_scale: Tensor) -> Tensor:
        logits = _logits(x, landmarks, valid).add_(log_scale.unsqueeze(-2))
        return logits.sub_(finite_or_zero(logits.amax(-1, keepdim=True))).exp_()

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        x: Tensor,
        landmarks: Tensor,
        valid: Tensor,
        log_scale: Tensor,
        core: Tensor,
    ):
        batch, n, rank = x.shape[0], x.shape[-2], landmarks.shape[-2]
        full = x.new_empty(batch, n, core.shape[-1])
        total = x.new_empty(batch, n, 1)
        mask = _mask_or_none(valid)
        for g in batch_groups(batch, n * rank * x.element_size(), x.device):
            a = Readout._weights(
                x[g], landmarks[g], None if mask is None else mask[g], log_scale[g]
            )
            _bmm_into(full[g], a, core[g])
            total[g] = a.sum(-1, keepdim=True)
        ctx.save_for_backward(x, landmarks, valid, log_scale, core)
        return full[..., :-1], full[..., -1:], total

    @staticmethod
    def backward(ctx: FunctionCtx, grad_num: Tensor, grad_den: Tensor, grad_total: Tensor):
        x, landmarks, valid, log_scale, core = ctx.saved_tensors
        grad_x, grad_lm = torch.empty_like(x), torch.empty_like(landmarks)
        grad_core = torch.empty_like(core)
        mask = _mask_or_none(valid)
        item_bytes = x.shape[-2] * landmarks.shape[-2] * x.element_size()
        for g in batch_groups(x.shape[0], item_bytes, x.device):
            mask_g = None if mask is None else mask[g]
            a = Readout._weights(x[g], landmarks[g], mask_g, log_scale[g])
            grad_full = torch.cat([grad_num[g], grad_den[g]], -1).add_(0.0)  # as the slices' sum
            grad_core[g] = a.transpose(-1, -2) @ grad_full
            grad_a = (grad_full @ core[g].transpose(-1, -2)).add_(grad_total[g])
            grad_logits = _zero_invalid_(grad_a.mul_(a), mask_g)
            _bmm_into(grad_x[g], grad_logits, landmarks[g])
            grad_lm[g] = (x[g].transpose(-1, -2) @ grad_logits).transpose(-1, -2)
            grad_lm[g] += _landmark_norm_grad(grad_logits, landmarks[g])
        return grad_x, grad_lm, None, None, grad_core


def nystrom_softmax_streamed(
    q_s: Tensor,
    k_s: Tensor,
    v: Tensor,
    landmarks: Tensor,
    valid: Tensor,
    den_floor: float = 1e-6,
    key_precision: str = "float64",
) -> tuple[Tensor, dict[str, Tensor]]:
    """:func:`rpka.attention.nystrom.nystrom_softmax` with the streamed (n x r) stages.

    Same arguments, estimate and guards; shapes (..., n, d) with any leading dims.
    ``key_precision``: the key side in float64 (``"float64"``, the reference's) or, with
    ``"auto"``, in the compute dtype while the logits allow (as the inference path's,
    :func:`rpka.attention.nystrom_chunked.narrow_key_dtype`); the backward follows the forward.
    """
    batch_shape = q_s.shape[:-2]
    q_s, k_s, v, landmarks = (_flat(x) for x in (q_s, k_s, v, landmarks))
    valid = valid.reshape(-1, valid.shape[-1])
    key_dtype = narrow_key_dtype(key_precision, landmarks, valid)
    rho, moments = KeyMoments.apply(k_s, v, landmarks.to(key_dtype), valid)
    if key_dtype != CORE_DTYPE and too_sharp(rho):  # widen: the float64 pass decides
        rho, moments = KeyMoments.apply(k_s, v, landmarks.to(CORE_DTYPE), valid)
    core = solve_graded(rho, moments, landmarks, valid, k_s.dtype)
    num, den, total = Readout.apply(q_s, landmarks, valid, core.log_scale, core.scaled)
    tiny = torch.finfo(num.dtype).tiny  # keeps 0/0 out if every term vanished
    floor = (den_floor * total).clamp(min=tiny)
    out, counts = guarded_ratio(num, den, floor, v)
    return out.reshape(*batch_shape, *out.shape[-2:]), counts
