"""Output guards shared by the approximate attentions whose weights can turn negative.

A Nystrom estimate of ``softmax(q k^T) v`` is a ratio ``num / den`` whose implied weights are
not entrywise positive, so ``den`` can be tiny or negative and the output can leave the
convex hull of the values. Two guards (docs/design.md section 2) keep it sane, and their firing
is counted so that reports can say how often they acted:

* **denominator floor**: ``den`` is raised to a caller-chosen floor (the exact denominator
  is positive);
* **value hull**: each output coordinate is clamped to ``[min_j v_j, max_j v_j]`` (the exact
  output is a convex combination of the values).

Thresholds are relative to the size of what they guard (issue 13): the floor is a fraction
of the magnitude of the terms the denominator sums, and the hull counts an entry as
clamped only when it is outside by more than round-off (:func:`hull_tolerance`); a sharp,
correct output equal to an extreme value is not a firing. Counts become shares of rows
(:func:`guard_shares`), and a guard that fires on more than ``WARN_SHARE`` of rows warns
once per process (:func:`warn_frequent`): a frequent guard is a finding, not a detail.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

WARN_SHARE = 0.01  # a guard firing on more than 1 % of rows warns (once per process)
HULL_ULPS = 64  # an output outside the value range by more than this many ulps is clamped
# the share each guard's count is taken of
GUARD_TOTALS = {"denominator": "rows", "clamped": "entries"}
_warned: set[tuple[str, str]] = set()


def hull_tolerance(v_min: Tensor, v_max: Tensor) -> Tensor:
    """Round-off allowance of the value-hull guard, relative to the size of the values."""
    return HULL_ULPS * torch.finfo(v_min.dtype).eps * torch.maximum(v_min.abs(), v_max.abs())


def guard_shares(counts: dict[str, int]) -> dict[str, float]:
    """Share of rows (entries, for the hull) on which each guard fired: counts from
    ``guard_counts`` -> ``{"denominator": ..., "clamped": ...}`` (empty without guards)."""
    return {
        name: counts[name] / max(counts[total], 1)
        for name, total in GUARD_TOTALS.items()
        if name in counts and total in counts
    }


def warn_frequent(method: str, shares: dict[str, float]) -> None:
    """Warn once per process and (method, guard) when a guard fired on > ``WARN_SHARE``."""
    for guard, share in shares.items():
        if share > WARN_SHARE and (method, guard) not in _warned:
            _warned.add((method, guard))
            warnings.warn(
                f"{method}: the {guard!r} guard fired on {share:.1%} of rows (more than "
                f"{WARN_SHARE:.0%}); the output there is guarded, not the estimate",
                RuntimeWarning,
                stacklevel=3,
            )


def clamp_to_values(out: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Clamp out (..., n, d_v) coordinate-wise to the range of v (..., m, d_v).

    Returns the clamped output and the number of entries that were outside by more than
    round-off (a tensor).
    """
    v_min = v.amin(-2, keepdim=True)
    v_max = v.amax(-2, keepdim=True)
    with torch.no_grad():
        tol = hull_tolerance(v_min, v_max)
        clamped = (out < v_min - tol) | (out > v_max + tol)
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
