"""The causal forward as it was before issue 55, frozen: the reference that the committed
lm-track results were trained with. ``tests/test_causal_speed.py`` checks the current
``rpka.attention.causal.causal_forward`` against it bit for bit (outputs, gradients, guard
counts). Only the pieces issue 55 rewrote are copied here; the landmark draw, the Cholesky
factor, the core solve and the clamp are the package's own (unchanged by it).
"""

import itertools
import math

import torch
import torch.nn.functional as F

from rpka.attention.causal_landmarks import LandmarkSet, Moments, draw_blocks, past_is_exact
from rpka.attention.guards import clamp_between, hull_tolerance
from rpka.attention.nystrom import finite_or_zero


def local_scores(q_s, k_local, causal):
    scores = q_s @ k_local.transpose(-1, -2) - q_s.pow(2).sum(-1, keepdim=True) / 2
    if causal:
        future = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return scores


def combine(scores, v_local, v_low, v_high, den_floor, past=None):
    ref = scores.amax(-1, keepdim=True).detach()
    if past is None:
        e = torch.exp(scores - ref)
        return (e @ v_local) / e.sum(-1, keepdim=True), None, None
    logits, core = past
    ref = finite_or_zero(torch.maximum(ref, logits.amax(-1, keepdim=True).detach()))
    e = torch.exp(scores - ref)
    a = torch.exp(logits - ref)
    past_sum = a @ core
    past_den = past_sum[..., -1:]
    floor = den_floor * a.sum(-1, keepdim=True)
    floored = past_den < floor
    den = e.sum(-1, keepdim=True) + torch.where(floored, floor, past_den)
    den = den.clamp(min=torch.finfo(den.dtype).tiny)
    out = (e @ v_local + past_sum[..., :-1]) / den
    with torch.no_grad():
        tol = hull_tolerance(v_low, v_high)
        clamped = (out < v_low - tol) | (out > v_high + tol)
    return clamp_between(out, v_low, v_high), floored, clamped


def count_guards(guards, floored, clamped, rows):
    rows = rows.expand_as(floored)
    guards["denominator"] += (floored & rows).sum()
    guards["rows"] += rows.sum()
    guards["clamped"] += (clamped & rows).sum()
    guards["entries"] += rows.sum() * clamped.shape[-1]


def count_exact_rows(guards, out, rows):
    never = torch.zeros_like(out[..., :1], dtype=torch.bool)
    count_guards(guards, never, never.expand_as(out), rows)


def to_blocks(x, block_size):
    pad = -x.shape[-2] % block_size
    return F.pad(x, (0, 0, 0, pad)).unflatten(-2, (-1, block_size))


def merge(m1, m2):
    rho = torch.maximum(m1.rho, m2.rho)
    a, b = torch.exp(m1.rho - rho), torch.exp(m2.rho - rho)
    return Moments(rho, a.unsqueeze(-1) * m1.num + b.unsqueeze(-1) * m2.num)


def prefix_merge(moments):
    size, stride = moments.rho.shape[-2], 1
    while stride < size:
        merged = merge(moments.part(slice(None, -stride)), moments.part(slice(stride, None)))
        moments = Moments.cat([moments.part(slice(None, stride)), merged])
        stride *= 2
    return moments


def epoch_moments(landmarks, k_c, v, start, stop, b):
    first = landmarks.moments(k_c[..., : start * b, :], v[..., : start * b, :]).unsqueeze()
    if stop - start == 1:
        return first
    later = slice(start * b, (stop - 1) * b)
    k_blocks = k_c[..., later, :].unflatten(-2, (-1, b))
    v_blocks = v[..., later, :].unflatten(-2, (-1, b))
    blocks = landmarks.per_block().moments(k_blocks, v_blocks)
    return prefix_merge(Moments.cat([first, blocks]))


def causal_forward(q_s, k_s, v, block_size, sampler, den_floor):
    """The old ``causal_forward``: out (..., n, d_v) and guard counts."""
    n, b = q_s.shape[-2], block_size
    n_blocks = math.ceil(n / b)
    centre = k_s[..., :b, :].mean(-2, keepdim=True)
    k_c = k_s - centre
    k_local = torch.cat([k_s[..., :b, :], k_c[..., b:, :]], dim=-2)
    q_b, k_b, v_b = (to_blocks(x, b) for x in (q_s, k_local, v))
    scores = local_scores(q_b, k_b, causal=True)
    v_low = to_blocks(torch.cummin(v, dim=-2).values, b)
    v_high = to_blocks(torch.cummax(v, dim=-2).values, b)
    is_real = to_blocks(torch.ones_like(v[..., :1], dtype=torch.bool), b)
    guards = {
        k: torch.zeros((), dtype=torch.long) for k in ("denominator", "rows", "clamped", "entries")
    }
    outs = [combine(scores[..., 0, :, :], v_b[..., 0, :, :], v_low, v_high, den_floor)[0]]
    ppp = sampler.points_per_position
    draws = draw_blocks(n_blocks, b, sampler.rank, ppp)
    for start, stop in itertools.pairwise([*draws, n_blocks]):
        rows = slice(start, stop)
        if past_is_exact(start, b, sampler.rank, ppp):
            past_scores = local_scores(q_b[..., start, :, :], k_c[..., : start * b, :], False)
            out = combine(
                torch.cat([past_scores, scores[..., start, :, :]], dim=-1),
                torch.cat([v[..., : start * b, :], v_b[..., start, :, :]], dim=-2),
                v_low[..., start, :, :],
                v_high[..., start, :, :],
                den_floor,
            )[0].unsqueeze(-3)
            count_exact_rows(guards, out, is_real[..., rows, :, :])
            outs.append(out)
            continue
        landmarks = LandmarkSet.draw(sampler, q_s[..., : start * b, :], k_c[..., : start * b, :])
        moments = epoch_moments(landmarks, k_c, v, start, stop, b)
        blocks = landmarks.per_block()
        core = blocks.solve(moments)
        past = (blocks.past_logits(q_b[..., start:stop, :, :], core), core.scaled)
        out, floored, clamped = combine(
            scores[..., rows, :, :],
            v_b[..., rows, :, :],
            v_low[..., rows, :, :],
            v_high[..., rows, :, :],
            den_floor,
            past,
        )
        count_guards(guards, floored, clamped, is_real[..., rows, :, :])
        outs.append(out)
    out = torch.cat([outs[0].unsqueeze(-3), *outs[1:]], dim=-3).flatten(-3, -2)[..., :n, :]
    return out, guards
