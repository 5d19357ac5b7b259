"""The local part of causal RPKA's streamed inference path (issue 55): exact causal softmax
inside each block, by SDPA's fused CPU kernel on the blocks stacked in its batch dimension,
with the log-sum-exp that eq. (1) of :mod:`rpka.attention.causal` adds the past part to.

The kernel computes whole tiles; a block's masked half is skipped by splitting it into
sub-blocks that read keys only up to their own end (:func:`causal_tiles`)."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator

import torch
from torch import Tensor


def fused_local(
    q: Tensor, k: Tensor, v: Tensor, block: int, scale: float, chunk_bytes: int
) -> tuple[Tensor, Tensor]:
    """Causal softmax inside every block of ``block`` positions, by SDPA's fused CPU kernel
    on the stacked blocks: q, k (B, n, d) and v (B, n, d_v), *unscaled* (``q~ = q scale``).

    -> out (B, n, d_v) (each block normalised on its own) and its log-sum-exp (B, n, 1) of
    ``q~_i.k~_j`` over ``cb <= j <= i``. ``chunk_bytes``: the most one kernel call's output
    may hold (:func:`causal_tiles`)."""
    n, b = q.shape[-2], block
    full = n // b
    batch, dv = q.shape[0], v.shape[-1]
    out = torch.empty(batch, n, dv, dtype=v.dtype)
    lse = torch.empty(batch, n, 1, dtype=v.dtype)
    for rows, size in ((slice(0, full * b), b), (slice(full * b, n), n - full * b)):
        if rows.stop > rows.start:  # blocks in the kernel's batch dimension
            parts = [x[:, rows].reshape(-1, 1, size, x.shape[-1]) for x in (q, k, v)]
            tiles = [x[:, rows].unflatten(1, (-1, size)) for x in (out, lse)]  # (B, G, b, .)
            causal_tiles(*parts, *tiles, scale**2, chunk_bytes)
    return out, lse


def causal_tiles(
    q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, scale: float, chunk_bytes: int
) -> None:
    """Causal attention inside each of N tiles: q, k (N, 1, b, d), v (N, 1, b, d_v); writes
    out (B, G, b, d_v) and lse (B, G, b, 1), N = B G.

    The CPU kernel computes a whole (query split x key split) tile even where the causal
    mask zeroes it, and at b = 256 one key split spans the block, so a block's masked half
    costs as much as its live half. Sub-blocks of :data:`LOCAL_SUB_ROWS` rows each read the
    keys up to their own end only (a (h x h (s + 1)) tile, its last (h x h) masked by an
    additive mask): 62.5 % of the block's products at b = 256. The outputs are the single
    call's to round-off (~6e-7 absolute in float32: the kernel sums other key splits;
    ``tests/test_causal_stream.py``). Each call takes as many tiles as keep its output within
    ``chunk_bytes`` (the output is copied into ``out``: the peak of a forward)."""
    kernel = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    b = q.shape[-2]
    h = LOCAL_SUB_ROWS if b % LOCAL_SUB_ROWS == 0 else b
    step = max(1, chunk_bytes // (h * v.shape[-1] * v.element_size()))
    for tiles, tile_out, tile_lse in tile_runs(out, lse, step):
        for i in range(b // h):
            rows, keys = slice(i * h, (i + 1) * h), slice(0, (i + 1) * h)
            mask = None if i == 0 else diagonal_mask(h, i, q.dtype)
            part, part_lse = kernel(
                q[tiles, :, rows], k[tiles, :, keys], v[tiles, :, keys], 0.0, i == 0,
                attn_mask=mask, scale=scale,
            )[:2]  # fmt: skip
            tile_out[:, rows] = part.squeeze(1)
            tile_lse[:, rows] = part_lse.squeeze(1).unsqueeze(-1)


def tile_runs(out: Tensor, lse: Tensor, step: int) -> Iterator[tuple[slice, Tensor, Tensor]]:
    """Runs of at most ``step`` tiles of out (B, G, b, d_v) and lse (B, G, b, 1): the tiles'
    slice of N = B G and views (T, b, .) of the two, in place; a batch entry's tiles run
    apart where (B, G) cannot merge (a partial last block leaves gaps between them)."""
    batch, groups = out.shape[:2]
    if out.stride(0) == groups * out.stride(1):
        pieces = [(0, out.flatten(0, 1), lse.flatten(0, 1))]
    else:
        pieces = [(i * groups, out[i], lse[i]) for i in range(batch)]
    for base, o, lo in pieces:
        for t0 in range(0, o.shape[0], step):
            t1 = min(t0 + step, o.shape[0])
            yield slice(base + t0, base + t1), o[t0:t1], lo[t0:t1]


# Rows per sub-block of the local part (:func:`causal_tiles`). Measured at (1, 8, n, 64), r =
# 64, b = 256, one thread, against one call per block (interleaved, in process): 64 rows
# 0.964x / 0.962x the forward's time at 4,096 / 8,192 tokens; 32 rows read 0.970x beside 64's
# 0.979x in one pair of runs at 4,096 (within noise), so 64, the fewer calls.
LOCAL_SUB_ROWS = 64


@functools.cache
def diagonal_mask(h: int, before: int, dtype: torch.dtype) -> Tensor:
    """Additive mask of a sub-block of h rows over its ``before`` earlier sub-blocks and
    itself: (h, h (before + 1)), -inf above the last (h x h) part's diagonal."""
    mask = torch.zeros(h, h * (before + 1), dtype=dtype)
    mask[:, h * before :] = torch.full((h, h), -math.inf, dtype=dtype).triu(1)
    return mask
