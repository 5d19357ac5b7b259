"""Output guards shared by the approximate attentions whose weights can turn negative.

A Nystrom estimate of ``softmax(q k^T) v`` is a ratio ``num / den`` whose implied weights are
not entrywise positive, so ``den`` can be tiny or negative and the output can leave the
convex hull of the values. Two guards (DESIGN.md section 2) keep it sane, and their firing
is counted so that reports can say how often they acted:

* **denominator floor**: ``den`` is raised to a caller-chosen floor (the exact denominator
  is positive);
* **value hull**: each output coordinate is clamped to ``[min_j v_j, max_j v_j]`` (the exact
  output is a convex combination of the values).
"""

from __future__ import annotations

import torch
from torch import Tensor


def clamp_to_values(out: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Clamp out (..., n, d_v) coordinate-wise to the range of v (..., m, d_v).

    Returns the clamped output and the number of entries that were outside (a tensor).
    """
    v_min = v.amin(-2, keepdim=True)
    v_max = v.amax(-2, keepdim=True)
    with torch.no_grad():
        clamped = (out < v_min) | (out > v_max)
    return torch.minimum(torch.maximum(out, v_min), v_max), clamped.sum()


def guarded_ratio(
    num: Tensor, den: Tensor, floor: Tensor, v: Tensor
) -> tuple[Tensor, dict[str, Tensor]]:
    """``num / den`` with the denominator floored at ``floor`` and the result clamped to v.

    Args:
        num: (..., n, d_v) numerators.
        den: (..., n, 1) denominators.
        floor: broadcastable to ``den``; rows with ``den < floor`` use ``floor`` instead.
        v: (..., m, d_v) values (for the hull).

    Returns:
        out (..., n, d_v) and guard counts (tensors): ``denominator`` rows floored,
        ``clamped`` output entries clamped, with totals ``rows`` and ``entries``.
    """
    low = den < floor
    out, clamped = clamp_to_values(num / torch.where(low, floor, den), v)
    counts = {
        "denominator": low.sum(),
        "rows": torch.tensor(low.numel()),
        "clamped": clamped,
        "entries": torch.tensor(out.numel()),
    }
    return out, counts
