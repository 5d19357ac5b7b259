"""RPKA in one screen: the math as it reads, in float64, to test the fast paths against.

No guards, no fast paths, no log-domain tricks: every exponential is taken as it is, so it
is correct on moderate inputs only (logits of a few tens, pivots well apart) - which is
what a test chooses. Rule ``rpc`` with weighting ``gauss`` (RPKA's defaults) only. One
head at a time; :func:`rpka_reference` loops over the rest. Not a method of the registry.
Equations (docs/design.md section 2):

    q~ = alpha q d^{-1/4},   k~ = (k d^{-1/4} - mean_j k_j d^{-1/4}) / alpha            (P)
    e^{x.y} = e^{|x|^2/2} g(x, y) e^{|y|^2/2},   g(x, y) = exp(-|x - y|^2 / 2)             (G)
    out_i = sum_j e^{q~_i.k~_j} v_j / sum_j e^{q~_i.k~_j}          (exact; P changes nothing)
    RPCholesky of G = g(Z, Z), Z = [q~; k~] (or k~): r = 1, then per step
      s ~ r_s / sum r,   F_t = (G[:, s] - F F^T[:, s]) / sqrt(r_s),   r -= F_t^2          (R)
    e^{q~_i.k~_j} ~ e^{|q~_i|^2/2} g(q~_i, Z_S) G_SS^{-1} g(Z_S, k~_j) w_j,  w_j = e^{|k~_j|^2/2}
    out = K~ V / K~ 1 with that approximate kernel K~   (the query factor cancels)       (N)

Randomness: (R) draws pivot t by an exponential race, ``s = argmin_i (-log u_ti) / r_i``
(``P(s) = r_s / sum r``), from one uniform per point and step - the uniforms the package's
plain loop turns into Gumbel noise (``rpcholesky.GumbelStream``, step-major over the
batch, :func:`draw_uniforms`), so both pick the same pivots from the same generator.

Causal (``causal.py``, written plainly): positions in blocks of b; row i of block c
weights keys ``cb <= j <= i`` exactly and keys ``j < cb`` through (N) on landmarks drawn
from the points of positions ``< cb``; no q/k balance, keys centred by the mean of block
0's keys. Schedule: where the pool ``cb * (2 or 1)`` fits the rank the past is exact;
otherwise landmarks are redrawn at block ``c0`` (the first such block), then ``2 c0``,
``4 c0``, ... and kept in between.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

# Standalone on purpose: nothing from the fast code. The balance ratio of keys-only pivots,
# WildCat's rho (microsoft/wildcat, compress_kv.py RHO_2), typed again here; it equals
# ``rpka.attention.frame.KEYS_RATIO`` (tests/test_reference.py checks both).
KEYS_RATIO = 3.94582


def gaussian(x: Tensor, y: Tensor) -> Tensor:
    """``g(x, y) = exp(-|x - y|^2 / 2)``: x (n, d), y (m, d) -> (n, m). Eq. (G)."""
    return torch.exp(-((x[:, None, :] - y[None, :, :]) ** 2).sum(-1) / 2)


def pivoted_points(
    q: Tensor, k: Tensor, pivot_set: str = "joint", balance: bool = True
) -> tuple[Tensor, Tensor, Tensor]:
    """``(q~, k~, Z)`` of eq. (P): q (n, d), k (m, d) -> (n, d), (m, d), Z (n + m or m, d).

    ``alpha^2 = ratio * max_j |k~_j| / max_i |q~_i|`` before balancing (ratio 1 for the
    joint set, ``KEYS_RATIO`` for keys only), as ``frame.balanced_frame``; ``balance=False``
    gives alpha = 1.
    """
    q, k = q.double() * q.shape[-1] ** -0.25, k.double() * k.shape[-1] ** -0.25
    k = k - k.mean(0)
    ratio = 1.0 if pivot_set == "joint" else KEYS_RATIO
    alpha = (ratio * k.norm(dim=-1).max() / q.norm(dim=-1).max()).sqrt() if balance else 1.0
    q, k = q * alpha, k / alpha
    return q, k, torch.cat([q, k]) if pivot_set == "joint" else k


def draw_uniforms(
    generator: torch.Generator | None, rank: int, batch: tuple[int, ...], n_points: int
) -> Tensor:
    """(rank, *batch, N) uniforms in float64: what the plain loop draws for that batch."""
    return torch.rand((rank, *batch, n_points), generator=generator, dtype=torch.float64)


def rpcholesky_reference(points: Tensor, rank: int, uniforms: Tensor) -> tuple[Tensor, Tensor]:
    """Eq. (R), one pivot per step: points (N, d), uniforms (>= rank, N) -> pivots (r,), F (N, r).

    ``r = min(rank, N)``. No pivot floor: the points must be well apart (no residual near 0).
    """
    g = gaussian(points, points)
    n = points.shape[0]
    rank = min(rank, n)
    factor, residual = g.new_zeros(n, rank), g.new_ones(n)
    pivots = torch.empty(rank, dtype=torch.long)
    for t in range(rank):
        s = int(torch.argmin(-torch.log(uniforms[t]) / residual))  # P(s) = r_s / sum r
        factor[:, t] = (g[:, s] - factor @ factor[s]) / residual[s].sqrt()
        residual = (residual - factor[:, t] ** 2).clamp(min=0)  # a Schur diagonal is >= 0
        residual[s] = 0  # ... and 0 on its pivot, exactly
        pivots[t] = s
    return pivots, factor


def nystrom_kernel(x: Tensor, y: Tensor, landmarks: Tensor) -> Tensor:
    """Eq. (N)'s kernel ``e^{|x|^2/2} g(x, Z_S) G_SS^{-1} g(Z_S, y) e^{|y|^2/2}`` ~ ``e^{x.y}``.

    x (n, d), y (m, d), landmarks (r, d) -> (n, m).
    """
    x, y, s = x.double(), y.double(), landmarks.double()
    core = torch.linalg.solve(gaussian(s, s), gaussian(s, y))  # G_SS^{-1} g(Z_S, y)
    lift_x, lift_y = torch.exp(x.pow(2).sum(-1) / 2), torch.exp(y.pow(2).sum(-1) / 2)
    return lift_x[:, None] * (gaussian(x, s) @ core) * lift_y[None, :]


def ratio(weights: Tensor, v: Tensor) -> Tensor:
    """``out_i = sum_j a_ij v_j / sum_j a_ij``: weights (n, m), v (m, d_v) -> (n, d_v)."""
    return (weights @ v.double()) / weights.sum(-1, keepdim=True)


def nystrom_reference(q_pts: Tensor, k_pts: Tensor, v: Tensor, landmarks: Tensor) -> Tensor:
    """Eq. (N) on given landmarks: pivoted points q~ (n, d), k~ (m, d), v (m, d_v),
    landmarks (r, d) -> (n, d_v)."""
    return ratio(nystrom_kernel(q_pts, k_pts, landmarks), v)


def exact_reference(q_pts: Tensor, k_pts: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """Exact attention ``sum_j e^{q~_i.k~_j} v_j / sum_j e^{q~_i.k~_j}`` (j <= i if causal)."""
    weights = torch.exp(q_pts.double() @ k_pts.double().T)
    return ratio(weights.tril() if causal else weights, v)


def causal_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rank: int,
    generator: torch.Generator | None,
    pivot_set: str = "joint",
    block: int = 64,
) -> Tensor:
    """Causal RPKA (module docstring): q, k (B, n, d), v (B, n, d_v) -> (B, n, d_v)."""
    d, n = q.shape[-1], q.shape[-2]
    q_s, k_s = q.double() * d**-0.25, k.double() * d**-0.25
    k_c = k_s - k_s[:, :block].mean(-2, keepdim=True)  # centre: block 0's keys
    exact = torch.exp(q_s @ k_c.transpose(-1, -2)).tril()  # e^{q~_i.k'_j}, j <= i
    weights, lm, draw_at = exact.clone(), None, 1
    per_position = 2 if pivot_set == "joint" else 1
    for c in range(1, math.ceil(n / block)):
        rows, past = slice(c * block, (c + 1) * block), c * block
        if past * per_position <= rank:  # every earlier point a landmark: exact past
            lm, draw_at = None, c + 1
            continue
        if c == draw_at:  # landmarks of the points of positions < cb
            pts = k_c[:, :past]
            if per_position == 2:
                pts = torch.cat([q_s[:, :past], pts], 1)
            u = draw_uniforms(generator, rank, (len(pts),), pts.shape[1])
            lm = [z[rpcholesky_reference(z, rank, u[:, b])[0]] for b, z in enumerate(pts)]
            draw_at = 2 * c
        for b, z in enumerate(lm):
            weights[b, rows, :past] = nystrom_kernel(q_s[b, rows], k_c[b, :past], z)
    return torch.stack([ratio(w, x) for w, x in zip(weights, v, strict=True)])


def rpka_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rank: int,
    generator: torch.Generator | None = None,
    pivot_set: str = "joint",
    causal: bool = False,
    causal_block: int = 64,
) -> Tensor:
    """RPKA with weighting ``gauss``, rule ``rpc``: q, k (..., n|m, d), v (..., m, d_v).

    Draws the plain loop's randomness (``pivot_method="plain"`` of ``RPKAttention``; the
    causal path always uses that loop), so with the same generator state both agree - for
    float64 inputs (the loop draws its uniforms in the compute dtype).
    """
    batch = q.shape[:-2]
    flat = [x.reshape(-1, *x.shape[-2:]) for x in (q, k, v)]
    if causal:
        out = causal_reference(*flat, rank, generator, pivot_set, causal_block)
        return out.reshape(*batch, *out.shape[-2:])
    points = [pivoted_points(qb, kb, pivot_set) for qb, kb in zip(flat[0], flat[1], strict=True)]
    n_points = points[0][2].shape[0]
    u = draw_uniforms(generator, min(rank, n_points), batch, n_points)
    u = u.reshape(u.shape[0], -1, n_points)  # (r, B, N): the batch flattened
    outs = []
    for b, ((q_p, k_p, z), vb) in enumerate(zip(points, flat[2], strict=True)):
        pivots, _ = rpcholesky_reference(z, rank, u[:, b])
        outs.append(nystrom_reference(q_p, k_p, vb, z[pivots]))
    return torch.stack(outs).reshape(*batch, *outs[0].shape)
