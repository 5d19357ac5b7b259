"""Guard 3's running value range in numba: one pass over a chunk's blocks (issue 55).

The streamed causal path needs, for the rows of a chunk whose outputs left the range at
their block's first row, the exact running range ``[min, max]_{j <= t} v_j``. With
``torch.cummin`` / ``torch.cummax`` per block (~8 ns an entry: index bookkeeping) and the
extremes of every earlier row taken again per block, this was ~40 ms of a 245 ms forward
at (1, 8, 4,096, 64) with sharp attention (logit std 3), where most chunks take this path
and almost no entry is clamped. Here each block starts from the range at its first row
(``causal_layout.block_ranges``, which holds every earlier row) and one loop carries the
running minimum and maximum down its rows, counting the outputs that lie outside - the
guard's question, answered in the same pass; the inner loop runs over the d_v contiguous
values. Minimum and maximum are exact, so the values are
``cummin`` / ``cummax``'s bit for bit on finite inputs (the streamed path checks its
inputs for nan and inf before it runs).

numba is loaded lazily and the kernel compiled once per process by
:func:`rpka.attention.pivot_kernel.compiled`; without numba :data:`AVAILABLE` is False and
the caller uses ``torch.cummin`` / ``torch.cummax``.
"""

from __future__ import annotations

import numpy as np

from rpka.attention import pivot_kernel
from rpka.attention.pivot_kernel import AVAILABLE

__all__ = ["AVAILABLE", "running_range"]


def _running_range(
    v: np.ndarray,
    start_low: np.ndarray,
    start_high: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    out: np.ndarray,
) -> int:
    """v (B, G, b, d) blocks; start_low / start_high (B, G, d) the range at each block's
    first row (that row included); low / high (B, G, b, d), written: the running range;
    out (B, G, b, d) the rows' outputs, read: -> how many of its entries lie outside their
    row's range (strictly below or above; a nan entry counts as outside)."""
    batch, groups, rows, width = v.shape
    outside = 0
    for e in range(batch):
        for g in range(groups):
            low_prev, high_prev = start_low[e, g], start_high[e, g]
            for t in range(rows):
                row, lo, hi, o = v[e, g, t], low[e, g, t], high[e, g, t], out[e, g, t]
                for x in range(width):
                    value = row[x]
                    lo[x] = value if value < low_prev[x] else low_prev[x]
                    hi[x] = value if value > high_prev[x] else high_prev[x]
                    outside += not (lo[x] <= o[x] <= hi[x])
                low_prev, high_prev = lo, hi
    return outside


def running_range(
    v: np.ndarray,
    start_low: np.ndarray,
    start_high: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    out: np.ndarray,
) -> int:
    """:func:`_running_range`, compiled at the first call in a process (same arguments)."""
    kernel = pivot_kernel.compiled(
        "range",
        "the compiled running range needs numba",
        lambda: pivot_kernel.numba.njit(cache=True, nogil=True)(_running_range),
    )
    return int(kernel(v, start_low, start_high, low, high, out))
