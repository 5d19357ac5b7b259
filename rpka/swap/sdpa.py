"""Serve ``torch.nn.functional.scaled_dot_product_attention`` (SDPA) by an approximation.

While a :class:`SDPASwap` is active (``with swap("rpka", rank=32): ...``, or as a
decorator), the attribute ``torch.nn.functional.scaled_dot_product_attention`` is replaced
by a function that serves each call with the chosen method of ``rpka.attention`` - so
nanoGPT-style code, Hugging Face models with ``attn_implementation="sdpa"`` and
``nn.MultiheadAttention(need_weights=False)`` (``nn.TransformerEncoderLayer`` outside its
fused eval fast path) run on RPKA without an edit. On exit the function that was there
on entry is put back: after a normal exit, an exception, a ``KeyboardInterrupt``, and
in nested blocks (innermost wins). Code that bound SDPA to a name of its own before the
block (``from torch.nn.functional import scaled_dot_product_attention``) is not reached.

SDPA's contract, and what of it is served (docs/swap.md has the table):

* q (..., L, E), k (..., S, E), v (..., S, Ev) with the same leading dims (``L != S``
  included), float32 or float64, on a CPU or CUDA device -> (..., L, Ev);
* ``scale=``: folded into q (the methods use ``1 / sqrt(E)``; ``q * scale * sqrt(E)``
  gives the same logits);
* ``is_causal=True`` with ``L == S``: the method's causal form (RPKA's blockwise causal
  path; ``exact``); the non-causal peers refuse it;
* ``enable_gqa=True``: k and v heads are repeated to the query heads, as SDPA does;
* ``attn_mask``: served when it is SDPA's causal mask, masks nothing, or is key padding
  alone or with a causal part (``rpka.attention.masks``; bool, or float with 0 and -inf /
  the dtype's minimum) - read, not assumed;
* ``dropout_p > 0``: never (SDPA drops attention weights; an approximation has none).

A call that cannot be served raises :class:`SwapRefused` with one line naming the
argument, or with ``fallback="exact"`` runs the original SDPA and is counted as not
swapped (a warning at exit says how many). Nothing is changed silently. The patch is
process-wide, like any assignment to a module attribute: other threads calling SDPA
meanwhile are served too.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rpka.attention import build, masks, options_of

FALLBACKS = ("error", "exact")
SERVED_DTYPES = (torch.float32, torch.float64)
SERVED_DEVICES = ("cpu", "cuda")

TORCH_SDPA = torch._C._nn.scaled_dot_product_attention  # what F's name is bound to
# set while a call is being served: SDPA calls made by the method itself (RPKA's exact
# short-cut, the exact method) or by an observer go to the original function
_SERVING = threading.local()


class SwapRefused(RuntimeError):
    """An SDPA call the swapped method cannot serve (one line: which argument, and how to
    run it anyway)."""


@dataclass
class CallRecord:
    """One SDPA call inside a swap: its index in the block, where it came from (``site``,
    the innermost module path when a tracker is set, else ``"call <index>"``), whether the
    method served it, why not, and the CPU seconds of the call."""

    index: int
    site: str
    swapped: bool
    reason: str | None
    cpu_s: float


@contextlib.contextmanager
def serving() -> Any:
    """Calls of SDPA inside go straight to the original function."""
    before = getattr(_SERVING, "active", False)
    _SERVING.active = True
    try:
        yield
    finally:
        _SERVING.active = before


def causal_mask_kind(mask: Tensor, length: int, keys: int) -> str | None:
    """What a mask (..., L, S) does: ``"none"`` (masks nothing), ``"causal"`` (SDPA's
    ``is_causal`` mask, every slice), or None (anything else). Key padding and causal +
    key padding masks are planned by ``rpka.attention.masks.from_mask`` instead."""
    if mask.dim() < 2 or tuple(mask.shape[-2:]) != (length, keys):
        return None
    try:
        visible = masks.visible_of(mask)[0]
    except masks.MaskRefused:
        return None
    if bool(visible.all()):
        return "none"
    tril = torch.ones(length, keys, dtype=torch.bool, device=mask.device).tril()
    return "causal" if bool((visible == tril).all()) else None


def refusal(
    causal_reason: str | None, q: Tensor, k: Tensor, v: Tensor, args: dict
) -> tuple[str | None, bool, masks.PrefixMask | None]:
    """Why the method cannot serve this call (None: it can), whether the call is causal, and
    the planned key padding (``rpka.attention.masks``; None: no mask to apply).
    ``causal_reason``: why the method has no causal form (None: it has one)."""
    tensors = (q, k, v)
    if any(not isinstance(x, Tensor) for x in tensors):
        return "q, k, v must be tensors", False, None
    if q.dtype not in SERVED_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"dtype {q.dtype}/{k.dtype}/{v.dtype} (served: float32, float64)", False, None
    if q.device.type not in SERVED_DEVICES or not q.device == k.device == v.device:
        reason = f"device {q.device}/{k.device}/{v.device} (served: one cpu or cuda device)"
        return reason, False, None
    if not 2 <= q.dim() == k.dim() == v.dim():
        return f"shapes {_shapes(q, k, v)} (served: (..., L, E) of equal rank)", False, None
    if args["dropout_p"] > 0:
        return f"dropout_p={args['dropout_p']} (dropout on attention weights)", False, None
    causal, padding = bool(args["is_causal"]), None
    # --- masks (issue 52): plain causal, key padding, causal + key padding -------------
    if args["attn_mask"] is not None:
        if causal:
            return "attn_mask together with is_causal=True", False, None
        mask = args["attn_mask"]
        try:
            padding = masks.from_mask(mask, tuple(q.shape), k.shape[-2])
        except masks.MaskRefused as err:
            return f"attn_mask {tuple(mask.shape)}: {err}", False, None
        causal = padding is not None and padding.causal
        if padding is not None and padding.plain_causal(q.shape[-2], k.shape[-2]):
            padding = None  # SDPA's is_causal mask: the causal form on the call as it is
    if causal and causal_reason is not None:
        what = "is_causal=True" if padding is None else "attn_mask with a causal part"
        return f"{what} ({causal_reason})", True, None
    if causal and padding is None and q.shape[-2] != k.shape[-2]:
        return f"is_causal=True with L={q.shape[-2]} != S={k.shape[-2]}", True, None
    # --- end masks ------------------------------------------------------------------------
    return _shape_refusal(q, k, v, bool(args["enable_gqa"])), causal, padding


def _shape_refusal(q: Tensor, k: Tensor, v: Tensor, gqa: bool) -> str | None:
    heads_q = q.shape[-3] if q.dim() >= 3 else 1
    heads_k = k.shape[-3] if k.dim() >= 3 else 1
    if k.shape[-2] != v.shape[-2] or q.shape[-1] != k.shape[-1] or k.shape[:-2] != v.shape[:-2]:
        return f"shapes {_shapes(q, k, v)} do not fit (..., L, E), (..., S, E), (..., S, Ev)"
    if gqa and heads_q != heads_k and q.dim() >= 3 and heads_q % heads_k == 0:
        if q.shape[:-3] == k.shape[:-3]:
            return None
    if q.shape[:-2] != k.shape[:-2]:
        return f"leading dims {_shapes(q, k, v)} differ (broadcast or GQA without enable_gqa)"
    return None


def _shapes(q: Tensor, k: Tensor, v: Tensor) -> str:
    return f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"


def as_four_dims(x: Tensor) -> Tensor:
    """(..., n, d) -> (B, H, n, d): the methods' layout (the leading dims flattened)."""
    if x.dim() == 4:
        return x
    return x.reshape(1, math.prod(x.shape[:-2]), *x.shape[-2:])


class SDPASwap(contextlib.ContextDecorator):
    """Context manager and decorator: SDPA served by ``method`` at ``rank`` (see the
    module docstring). Use :func:`swap` to make one.

    Attributes:
        swapped, passed: calls served by the method, calls passed to exact attention
            (``fallback="exact"``), over every block this object has run.
        reasons: why calls were passed, with their counts.
        records: one :class:`CallRecord` per call when built with ``record=True``.
        site: optional callable naming the current call site (the audit's module tracker).
        observer: optional callable ``(record, q, k, v, args, out)`` run after each call
            (its own SDPA calls go to the original function).
        warn_at_exit: warn at the block's exit when calls were passed to exact attention.
    """

    def __init__(
        self,
        method: str = "rpka",
        rank: int = 64,
        *,
        fallback: str = "error",
        record: bool = False,
        **options: Any,
    ) -> None:
        if fallback not in FALLBACKS:
            raise ValueError(f"fallback must be one of {FALLBACKS}, got {fallback!r}")
        self.method, self.rank, self.fallback = method, rank, fallback
        takes = options_of(method)  # raises ValueError for an unknown method
        if "causal" in options:
            raise ValueError("causal is not an option here: each call's is_causal chooses it")
        self.options = {**({"rank": rank} if "rank" in takes else {}), **options}
        self.modules: dict[bool, nn.Module] = {}
        self.causal_reason: str | None = None
        if method == "exact":  # passes every call to the original function
            build(method, **self.options)  # only to refuse an unknown option now
        else:
            self.modules[False] = build(method, **self.options)  # bad options: ValueError now
            try:
                self.modules[True] = build(method, **self.options, causal=True)
            except ValueError as err:
                self.causal_reason = str(err).split(":")[0]
        self.swapped = self.passed = 0
        self.reasons: Counter[str] = Counter()
        self.records: list[CallRecord] | None = [] if record else None
        self.site: Callable[[], str | None] | None = None
        self.observer: Callable[..., None] | None = None
        self._saved: list[Callable[..., Tensor]] = []  # a stack: the decorator may re-enter
        self._calls = 0
        self._at_entry = (0, 0)
        self.warn_at_exit = True  # the audit reports the swapped share in its table instead

    def __enter__(self) -> SDPASwap:
        if not self._saved:  # the outermost entry: the exit warning counts from here
            self._at_entry = (self.swapped, self.passed)
        self._saved.append(F.scaled_dot_product_attention)
        F.scaled_dot_product_attention = self._replacement  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        F.scaled_dot_product_attention = self._saved.pop()  # type: ignore[assignment]
        swapped, passed = self.swapped - self._at_entry[0], self.passed - self._at_entry[1]
        if passed and self.warn_at_exit and not self._saved:  # passed on: never silent
            detail = ", ".join(f"{reason}: {n}" for reason, n in self.reasons.most_common(3))
            warnings.warn(
                f"rpka.swap: {passed} of {passed + swapped} SDPA calls ran exact attention, "
                f"not {self.method!r} ({detail})",
                stacklevel=2,
            )

    @property
    def original(self) -> Callable[..., Tensor]:
        """The SDPA this block replaced: the latest function saved on entry that is not a
        swap's (a re-entered decorator or a swap nested in another saved one), else torch's
        own - never a swap, so a call passed on can never come back here."""
        for fn in reversed(self._saved):
            if not isinstance(getattr(fn, "__self__", None), SDPASwap):
                return fn
        return TORCH_SDPA

    def _replacement(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attn_mask: Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> Tensor:
        args = {
            "attn_mask": attn_mask,
            "dropout_p": dropout_p,
            "is_causal": is_causal,
            "scale": scale,
            "enable_gqa": enable_gqa,
        }
        original = self.original
        if getattr(_SERVING, "active", False):
            return original(query, key, value, **args)
        if self.method == "exact":
            reason, causal, padding = None, False, None
        else:
            reason, causal, padding = refusal(self.causal_reason, query, key, value, args)
        index, self._calls = self._calls, self._calls + 1
        site = (self.site() if self.site is not None else None) or f"call {index}"
        if reason is not None and self.fallback == "error":
            raise SwapRefused(
                f"rpka.swap({self.method!r}) cannot serve the SDPA call at {site}: {reason}; "
                "pass fallback='exact' to run such calls exactly (counted as not swapped)"
            )
        start = time.process_time()
        with serving():
            if reason is not None or self.method == "exact":
                out = original(query, key, value, **args)
            else:
                out = self.serve(query, key, value, causal, scale, enable_gqa, padding)
        record = CallRecord(index, site, reason is None, reason, time.process_time() - start)
        self._count(record)
        if self.observer is not None:
            with serving():
                self.observer(record, query, key, value, args, out)
        return out

    def _count(self, record: CallRecord) -> None:
        if record.swapped:
            self.swapped += 1
        else:
            self.passed += 1
            self.reasons[(record.reason or "").split(" (")[0]] += 1
        if self.records is not None:
            self.records.append(record)

    def serve(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        causal: bool,
        scale: float | None,
        gqa: bool,
        padding: masks.PrefixMask | None = None,
    ) -> Tensor:
        """The method on q (..., L, E), k (..., S, E), v (..., S, Ev) -> (..., L, Ev);
        ``padding``: a key padding plan (``rpka.attention.masks``), served on the kept keys."""
        if gqa and q.dim() >= 3 and k.shape[-3] != q.shape[-3]:
            repeats = q.shape[-3] // k.shape[-3]  # SDPA's GQA: each kv head serves a group
            k, v = k.repeat_interleave(repeats, -3), v.repeat_interleave(repeats, -3)
        if scale is not None:
            # the methods use 1 / sqrt(E); folding the rest into q keeps every logit
            q = q * (scale * math.sqrt(q.shape[-1]))
        q4, k4, v4 = as_four_dims(q), as_four_dims(k), as_four_dims(v)
        if padding is not None:
            out = masks.attend(lambda *a: self.modules[a[3]](*a[:3]), q4, k4, v4, padding)
        else:
            out = self.modules[causal](q4, k4, v4)
        return out.reshape(*q.shape[:-1], v.shape[-1])


def swap(
    method: str = "rpka", rank: int = 64, *, fallback: str = "error", **options: Any
) -> SDPASwap:
    """SDPA served by ``method`` (``rpka``, ``nystrom-uniform``, ``keys-coreset``, ``exact``,
    any name of ``rpka.attention.REGISTRY``) at ``rank`` with the method's ``options``, as
    a context manager or a decorator (``torch.nn.attention.sdpa_kernel``'s style)::

        with swap("rpka", rank=32, fallback="exact") as s:
            loss = model(x).loss
        print(s.swapped, s.passed, s.reasons)

    ``fallback="error"`` (default) raises :class:`SwapRefused` at the first call the
    method cannot serve; ``"exact"`` runs it with the original SDPA and counts it.
    """
    return SDPASwap(method, rank, fallback=fallback, **options)
