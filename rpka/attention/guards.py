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


def strictly_inside(x: Tensor, lo: Tensor, hi: Tensor) -> bool:
    """``bool(((x > lo) & (x < hi)).all())`` for x (..., n, d_v) and bounds (..., 1, d_v),
    by two reductions along n: ``amin > lo`` and ``amax < hi`` (bounds of x's own shape,
    as causal RPKA's running range: the element-wise test).

    The same answer (a nan in x makes its column's extremes nan, and the test false), but
    the element-wise form broadcasts the bounds over every entry, two comparisons and an
    ``or`` through boolean temporaries: 11.6 ms against 0.8 ms for (8, 4096, 64) float32
    on one CPU thread (issue 39). A host synchronisation on a GPU.
    """
    with torch.no_grad():
        if lo.shape[-2] != 1 or hi.shape[-2] != 1:  # bounds per entry: no shortcut
            return bool(((x > lo) & (x < hi)).all())
        return bool(((x.amin(-2, keepdim=True) > lo) & (x.amax(-2, keepdim=True) < hi)).all())


def idle_on_cpu(x: Tensor, lo: Tensor, hi: Tensor) -> bool | None:
    """:func:`strictly_inside` on a CPU tensor; None on other devices, where the
    element-wise guard is cheap and the test's host synchronisation is not (the forward
    then keeps its old, sync-free form)."""
    if x.device.type != "cpu":
        return None
    return strictly_inside(x, lo, hi)


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


class _ClampToRange(torch.autograd.Function):
    """``minimum(maximum(x, lo), hi)`` with ``lo, hi`` the range of v along the sequence.

    The gradients are those of the composed ops (``amin``/``amax``, ``maximum``,
    ``minimum``), written out so that the common case is cheap: when every entry of x lies
    strictly inside its range (the guard is idle), x's gradient is the incoming one and
    v's is zero, which is what the composed ops give there, bit for bit. Otherwise the
    composed ops' backward formulas run as they are, ties included (half the gradient to
    each side of an equality, spread evenly over tied extremes). The equality with autograd
    on the composed ops is tested bit for bit (tests/test_training_speed.py). On the
    forecast shape (512, 96, 16) forward + backward took 39 ms composed, 17 ms here.
    """

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: Tensor, v: Tensor):
        """Returns the clamped x and the range ``lo, hi`` (no gradient)."""
        lo, hi = v.amin(-2, keepdim=True), v.amax(-2, keepdim=True)
        idle = idle_on_cpu(x, lo, hi)
        ctx.save_for_backward(x, v, lo, hi)
        ctx.idle = idle
        ctx.mark_non_differentiable(lo, hi)
        # strictly inside, the clamp is the identity: x itself (autograd returns a view of
        # it, with this function's gradient), no copy held beside the x saved above
        clamped = x if idle else torch.minimum(torch.maximum(x, lo), hi)
        return clamped, lo, hi

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor, *_range_grads: object):
        x, v, lo, hi = ctx.saved_tensors
        want_x, want_v = ctx.needs_input_grad[:2]
        idle = ctx.idle if ctx.idle is not None else strictly_inside(x, lo, hi)
        if idle:  # the guard is idle everywhere: the identity's gradient, not a copy of it
            return grad if want_x else None, torch.zeros_like(v) if want_v else None
        grad_x, grad_lo, grad_hi = _clamp_grads(grad, x, lo, hi)
        grad_v = _spread(grad_hi, hi, v) + _spread(grad_lo, lo, v) if want_v else None
        return grad_x if want_x else None, grad_v


class _Divide(torch.autograd.Function):
    """``num / den`` (den broadcast to num's shape) that saves its quotient instead of num.

    The gradients are autograd's own for division (``DivBackward0``), bit for bit:
    ``grad / den`` for num and ``-grad * ((num / den) / den)`` for den, each summed to its
    input's shape. ``num / den`` there is the forward's quotient, the same division of the
    same values, so it is read back instead of recomputed. The composed op keeps num alive
    for backward (in the Nystrom readout a view that holds the whole (n x (d_v + 1))
    product) beside the quotient the value-hull clamp saves anyway; this one keeps only
    the quotient (issue 39: peak memory of a training step). Tested against the composed
    division bit for bit (tests/test_training_speed.py).
    """

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, num: Tensor, den: Tensor):
        ratio = num / den
        ctx.save_for_backward(ratio, den)
        ctx.shapes = num.shape, den.shape
        return ratio

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor):
        ratio, den = ctx.saved_tensors
        num_shape, den_shape = ctx.shapes
        want_num, want_den = ctx.needs_input_grad
        grad_num = (grad / den).sum_to_size(num_shape) if want_num else None
        grad_den = _divisor_grad(grad, ratio, den).sum_to_size(den_shape) if want_den else None
        return grad_num, grad_den


DIVISOR_CHUNK = 2**16  # elements per chunk of _divisor_grad's temporaries, at least one row


def _divisor_grad(grad: Tensor, ratio: Tensor, den: Tensor) -> Tensor:
    """``-grad * (ratio / den)`` (grad and ratio of one shape), summed over the last dim
    where den is 1 there (its broadcast dim in the guards): then in chunks of the leading
    dim (one index of it at least), so that the two temporaries of the product stay
    cache-sized (each row sums the same, row by row). Otherwise the whole product, unsummed."""
    if den.shape[-1] != 1 or den.shape[:-1] != grad.shape[:-1] or grad.dim() < 2:
        return grad.neg().mul_(ratio / den)
    out = den.new_empty(den.shape)
    step = max(1, DIVISOR_CHUNK // max(grad[:1].numel(), 1))
    for start in range(0, grad.shape[0], step):
        part = slice(start, start + step)
        # (-grad) * (ratio / den), autograd's operand order, the product written in place
        product = grad[part].neg().mul_(ratio[part] / den[part])
        torch.sum(product, -1, keepdim=True, out=out[part])
    return out


def divide(num: Tensor, den: Tensor) -> Tensor:
    """``num / den`` through :class:`_Divide` (same dtype, num of the quotient's shape),
    else the plain op."""
    if num.dtype != den.dtype or torch.broadcast_shapes(num.shape, den.shape) != num.shape:
        return num / den
    return _Divide.apply(num, den)


def _clamp_grads(grad: Tensor, x: Tensor, lo: Tensor, hi: Tensor) -> tuple[Tensor, ...]:
    """Gradients of ``minimum(maximum(x, lo), hi)`` w.r.t. x, lo, hi (all of x's shape):
    PyTorch's own formulas for ``minimum`` then ``maximum`` (half to each side of a tie)."""
    m = torch.maximum(x, lo)
    t = torch.where(m == hi, grad / 2, grad)
    grad_m, grad_hi = t.masked_fill(m > hi, 0), t.masked_fill(m < hi, 0)
    u = torch.where(x == lo, grad_m / 2, grad_m)
    grad_x, grad_lo = u.masked_fill(x < lo, 0), u.masked_fill(x > lo, 0)
    return grad_x, grad_lo, grad_hi


class _ClampToBounds(torch.autograd.Function):
    """``minimum(maximum(x, lo), hi)`` for bounds of x's shape that carry a gradient of
    their own (causal RPKA: the running ``cummin`` / ``cummax`` of v, issue 28 lever 2).

    Where every entry of x lies strictly inside its bounds (the guard idle, the usual
    case) the composed ops' backward gives x the incoming gradient and the bounds exact
    zeros; here the bounds get no gradient at all (None), so the ``cummin`` / ``cummax``
    backward behind them - a scatter of zeros - does not run. x's gradient is the same
    bits; v's differs from the composed ops' only by those added zeros (the sign of an
    exact zero). Otherwise the composed ops' formulas run (:func:`_clamp_grads`).
    """

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: Tensor, lo: Tensor, hi: Tensor):
        ctx.save_for_backward(x, lo, hi)
        return torch.minimum(torch.maximum(x, lo), hi)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: Tensor):
        x, lo, hi = ctx.saved_tensors
        if strictly_inside(x, lo, hi):  # the guard is idle everywhere
            return grad.clone(), None, None
        return _clamp_grads(grad, x, lo, hi)


def clamp_between(x: Tensor, lo: Tensor, hi: Tensor) -> Tensor:
    """``torch.minimum(torch.maximum(x, lo), hi)`` with the idle-guard fast path of
    :class:`_ClampToBounds`; x, lo, hi of one shape (..., L, d_v)."""
    if lo.shape != x.shape or hi.shape != x.shape:  # broadcast bounds: the composed ops
        return torch.minimum(torch.maximum(x, lo), hi)
    return _ClampToBounds.apply(x, lo, hi)


def _spread(grad: Tensor, extreme: Tensor, v: Tensor) -> Tensor:
    """The gradient of ``amin``/``amax`` along -2: summed over the broadcast rows, then
    shared evenly by the entries of v equal to the extreme (as autograd does)."""
    tied = extreme == v
    return (grad.sum(-2, keepdim=True) / tied.sum(-2, keepdim=True)) * tied


def clamp_to_values(out: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Clamp out (..., n, d_v) coordinate-wise to the range of v (..., m, d_v).

    Returns the clamped output and the number of entries that were outside by more than
    round-off (a tensor).
    """
    if out.shape[:-2] != v.shape[:-2]:  # broadcast batch dimensions: the composed ops
        v_min, v_max = v.amin(-2, keepdim=True), v.amax(-2, keepdim=True)
        clamped_out = torch.minimum(torch.maximum(out, v_min), v_max)
    else:
        clamped_out, v_min, v_max = _ClampToRange.apply(out, v)
        if idle_on_cpu(out, v_min, v_max):  # strictly inside: nothing outside by round-off
            return clamped_out, torch.zeros((), dtype=torch.int64, device=out.device)
    with torch.no_grad():
        tol = hull_tolerance(v_min, v_max)
        clamped = (out < v_min - tol) | (out > v_max + tol)
    return clamped_out, clamped.sum()


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
    out, clamped = clamp_to_values(divide(num, torch.where(low, floor, den)), v)
    counts = {
        "denominator": low.sum(),
        "rows": torch.tensor(low.numel()),
        "clamped": clamped,
        "entries": torch.tensor(out.numel()),
    }
    return out, counts
