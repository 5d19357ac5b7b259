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
import functools
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
# A float16 / bfloat16 call (autocast included) is computed in float32 and returned in its
# dtype: the methods' Cholesky and pivot draws need float32's range and precision
WIDENED_DTYPES = (torch.float16, torch.bfloat16)


class _Dispatch:
    """The one function installed as ``F.scaled_dot_product_attention`` while any swap is
    active, in any thread: it sends each call to the innermost swap active **in the calling
    thread** (a per-thread stack), or to the function it replaced. Installed when the first
    swap enters, and the replaced function put back when the last one exits - whatever the
    order of exits, and however threads interleave - so no swap can stay installed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active = 0  # swaps entered and not exited, all threads
        self.replaced: Callable[..., Tensor] | None = None
        self.local = threading.local()

    def stack(self) -> list[SDPASwap]:
        """The calling thread's active swaps, innermost last."""
        if not hasattr(self.local, "stack"):
            self.local.stack = []
        return self.local.stack

    @property
    def original(self) -> Callable[..., Tensor]:
        """The SDPA the dispatcher replaced (torch's own when none is installed)."""
        return self.replaced or TORCH_SDPA

    @functools.cached_property
    def installed(self) -> Callable[..., Tensor]:
        """:func:`dispatch` as installed: ``torch.compiler.disable``d, so dynamo runs it
        eagerly (a graph break; the methods are not traceable). Made at the first swap, not
        at import: the decorator imports ``torch._dynamo`` (about 1 s, and numba with it),
        which a process that only imports ``rpka.swap`` should not pay."""
        return torch.compiler.disable(dispatch)

    def enter(self, swap: SDPASwap) -> None:
        with self.lock:
            if self.active == 0:
                self.replaced = F.scaled_dot_product_attention
                F.scaled_dot_product_attention = self.installed  # type: ignore[assignment]
            self.active += 1
        self.stack().append(swap)

    def exit(self, swap: SDPASwap) -> None:
        stack = self.stack()
        # the innermost entry of this swap, wherever it is: exits may come out of order
        del stack[len(stack) - 1 - stack[::-1].index(swap)]
        with self.lock:
            self.active -= 1
            if self.active == 0:
                if F.scaled_dot_product_attention is self.installed:  # else patched over us
                    F.scaled_dot_product_attention = self.replaced  # type: ignore[assignment]
                self.replaced = None


_DISPATCH = _Dispatch()


def dispatch(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """``F.scaled_dot_product_attention`` while a swap is active: the calling thread's
    innermost swap serves the call; a thread with none, or a call made while one is being
    served, runs the replaced function."""
    args = {"attn_mask": attn_mask, "dropout_p": dropout_p, "is_causal": is_causal,
            "scale": scale, "enable_gqa": enable_gqa}  # fmt: skip
    stack = _DISPATCH.stack()
    if not stack or getattr(_SERVING, "active", False):
        return _DISPATCH.original(query, key, value, **args)
    return stack[-1].call(query, key, value, args)


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


def check_arguments(args: dict[str, Any]) -> None:
    """Refuse what SDPA itself refuses, naming the argument (before any work): a mask that
    is not a tensor, a dropout probability outside [0, 1] (nan included), a scale that is
    not a finite number."""
    mask, dropout, scale = args["attn_mask"], args["dropout_p"], args["scale"]
    if mask is not None and not isinstance(mask, Tensor):
        raise TypeError(f"attn_mask must be a Tensor or None, got {type(mask).__name__}")
    if not isinstance(dropout, int | float) or not 0.0 <= dropout <= 1.0:
        raise ValueError(f"dropout_p must be a number in [0, 1], got {dropout!r}")
    if scale is not None and (not isinstance(scale, int | float) or not math.isfinite(scale)):
        raise ValueError(f"scale must be a finite number or None, got {scale!r}")


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
    dtypes = (*SERVED_DTYPES, *WIDENED_DTYPES)
    if q.dtype not in dtypes or k.dtype != q.dtype or v.dtype != q.dtype:
        served = "float32, float64; float16, bfloat16 computed in float32"
        return f"dtype {q.dtype}/{k.dtype}/{v.dtype} (served: {served})", False, None
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


def method_forms(method: str, options: dict[str, Any]) -> tuple[dict[bool, nn.Module], str | None]:
    """The method's non-causal and, where it has one, causal module (keyed by ``causal``),
    and why it has no causal form (None: it has one). Bad options raise ValueError."""
    modules: dict[bool, nn.Module] = {False: build(method, **options)}
    try:
        modules[True] = build(method, **options, causal=True)
    except ValueError as err:
        return modules, str(err).split(":")[0]
    return modules, None


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
        else:  # bad options: ValueError now
            self.modules, self.causal_reason = method_forms(method, self.options)
        self.swapped = self.passed = 0
        self.reasons: Counter[str] = Counter()
        self.records: list[CallRecord] | None = [] if record else None
        self.site: Callable[[], str | None] | None = None
        self.observer: Callable[..., None] | None = None
        self._depth = 0  # entries not yet exited: the decorator may re-enter
        self._calls = 0
        self._at_entry = (0, 0)
        self.warn_at_exit = True  # the audit reports the swapped share in its table instead

    def __enter__(self) -> SDPASwap:
        if self._depth == 0:  # the outermost entry: the exit warning counts from here
            self._at_entry = (self.swapped, self.passed)
        self._depth += 1
        _DISPATCH.enter(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _DISPATCH.exit(self)
        self._depth -= 1
        swapped, passed = self.swapped - self._at_entry[0], self.passed - self._at_entry[1]
        if passed and self.warn_at_exit and self._depth == 0:  # passed on: never silent
            detail = ", ".join(f"{reason}: {n}" for reason, n in self.reasons.most_common(3))
            warnings.warn(
                f"rpka.swap: {passed} of {passed + swapped} SDPA calls ran exact attention, "
                f"not {self.method!r} ({detail})",
                stacklevel=2,
            )

    @property
    def original(self) -> Callable[..., Tensor]:
        """The SDPA this swap passes calls on to: the function installed before any swap
        was active (torch's own unless something else had patched it) - never a swap."""
        return _DISPATCH.original

    def call(self, query: Tensor, key: Tensor, value: Tensor, args: dict[str, Any]) -> Tensor:
        """Serve one SDPA call (the dispatcher's, in the thread that entered this swap)."""
        check_arguments(args)  # what SDPA itself refuses, refused naming the argument
        original = self.original
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
            if reason is not None or self.method == "exact" or self.is_full_rank(key):
                out = original(query, key, value, **args)
            else:
                out = self.serve(
                    query, key, value, causal, args["scale"], args["enable_gqa"], padding
                )
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

    def is_full_rank(self, key: Tensor) -> bool:
        """Whether the rank reaches the call's number of keys S: then every key is a
        landmark, and the call is served by exact attention (the original SDPA with the
        call's own arguments) - full rank means exact, for every method, causal or not."""
        rank = self.options.get("rank")
        return rank is not None and rank >= key.shape[-2]

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
        ``padding``: a key padding plan (``rpka.attention.masks``), served on the kept keys;
        float16 / bfloat16 computed in float32 (autocast off inside) and returned in the
        input's dtype."""
        if q.dtype in WIDENED_DTYPES:
            with torch.autocast(q.device.type, enabled=False):
                out = self.serve(q.float(), k.float(), v.float(), causal, scale, gqa, padding)
            return out.to(q.dtype)
        if gqa and q.dim() >= 3 and k.shape[-3] != q.shape[-3]:
            repeats = q.shape[-3] // k.shape[-3]  # SDPA's GQA: each kv head serves a group
            k, v = k.repeat_interleave(repeats, -3), v.repeat_interleave(repeats, -3)
        if scale is not None:
            # the methods use 1 / sqrt(E); folding the rest into q keeps every logit
            q = q * (scale * math.sqrt(q.shape[-1]))
        q4, k4, v4 = as_four_dims(q), as_four_dims(k), as_four_dims(v)
        if padding is not None:
            rank = self.options.get("rank", 0)  # a call on at most `rank` kept keys: exact
            out = masks.attend(lambda *a: self.modules[a[3]](*a[:3]), q4, k4, v4, padding, rank)
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
