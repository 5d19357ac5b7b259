"""The one interface every attention method implements.

``forward(q, k, v)`` takes tensors of shape (B, H, n, d) (keys and values may have their
own length m) and returns (B, H, n, d_v): ``softmax(q k^T / sqrt(d)) v`` or an
approximation of it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from rpka.attention.cache import check_capacity, check_state, check_step
from rpka.attention.guards import guard_shares, warn_frequent
from rpka.attention.options import all_finite


def check_qkv(q: Tensor, k: Tensor, v: Tensor, *, check_finite: bool = True) -> None:
    """Raise ``ValueError`` naming the offending argument for malformed q, k, v."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name} must have shape (B, H, n, d), got {tuple(x.shape)}")
        if not x.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {x.dtype}")
    if q.device != k.device or k.device != v.device:
        raise ValueError(f"q, k, v must be on one device: got {q.device}, {k.device}, {v.device}")
    if q.dtype != k.dtype or k.dtype != v.dtype:
        raise ValueError(f"q, k, v must share a dtype: got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[:2] != k.shape[:2] or k.shape[:2] != v.shape[:2]:
        raise ValueError(
            "q, k and v must share (B, H): got "
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share d: got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must share the length m: got {k.shape[-2]} and {v.shape[-2]}")
    if k.shape[-2] < 1 and q.shape[-2] > 0:
        raise ValueError("k must hold at least one key (m >= 1) when there are queries (n >= 1)")
    if check_finite:
        for name, x in (("q", q), ("k", k), ("v", v)):
            refuse_non_finite(name, x)


def refuse_non_finite(name: str, x: Tensor, reduction: Tensor | None = None) -> None:
    """Raise ``ValueError`` naming ``name`` if x holds a nan or an inf.

    ``reduction``: a reduction of x already at hand that is finite only if every entry of
    x is (a sum, a mean, a maximum of row norms); when it is finite, x is not read again.
    Otherwise (a non-finite entry, or a finite one that overflowed the reduction) the
    check of :func:`rpka.attention.options.all_finite` decides.
    """
    if reduction is not None and bool(torch.isfinite(reduction).all()):
        return
    if not all_finite(x):
        raise ValueError(f"{name} contains non-finite values (nan or inf)")


def empty_problem(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """No output entries (B, H, n or d_v = 0) or no feature to compare (d = 0)."""
    return q.shape[-1] == 0 or q.shape[:-1].numel() == 0 or v.shape[-1] == 0


def softmax_of_nothing(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
    """Exact attention where it is trivial: empty output, or d = 0 (every logit 0, so each
    row averages the values it sees - all of them, or the first i + 1 when causal)."""
    out_shape = (*q.shape[:-1], v.shape[-1])
    if q.shape[:-1].numel() == 0 or v.shape[-1] == 0:
        return v.new_zeros(out_shape)
    if causal:
        seen = torch.arange(1, v.shape[-2] + 1, dtype=v.dtype, device=v.device).unsqueeze(-1)
        return v.cumsum(-2) / seen
    return v.mean(-2, keepdim=True).expand(out_shape).clone()


class AttentionMethod(nn.Module):
    """Base class: subclasses implement ``attend``; ``forward`` validates first.

    ``check_inputs=False`` skips the finiteness check, which costs a host synchronisation
    on a GPU (the benchmarks switch it off for every method alike).
    """

    name: str = ""

    def __init__(self, *, causal: bool = False, check_inputs: bool = True) -> None:
        super().__init__()
        self.causal = bool(causal)
        self.check_inputs = bool(check_inputs)
        self._guards: dict[str, Tensor] = {}  # a method with guards fills it in each call

    @property
    def guard_counts(self) -> dict[str, int]:
        """How often each guard fired in the last forward call (empty for a method without
        guards; a host sync on a GPU)."""
        return {key: int(value) for key, value in self._guards.items()}

    @property
    def guard_shares(self) -> dict[str, float]:
        """Share of rows on which each guard fired in the last call (``denominator``: of
        rows, ``clamped``: of output entries); empty for a method without guards."""
        return guard_shares(self.guard_counts)

    def report_guards(self) -> None:
        """Warn once per process when a guard fired on more than 1 % of rows (a host sync;
        done after each call when ``check_inputs`` is on)."""
        if self.check_inputs and self._guards:
            warn_frequent(self.name, self.guard_shares)

    def checks_finite_itself(self, q: Tensor, k: Tensor, v: Tensor) -> bool:
        """Whether ``attend`` checks q, k, v for nan and inf itself, in q, k, v order and
        with :func:`check_qkv`'s messages, from reductions it takes anyway (then
        ``forward`` does not check them apart); False unless a method overrides it."""
        return False

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        check_qkv(q, k, v, check_finite=False)
        if self.check_inputs and not self.checks_finite_itself(q, k, v):
            for name, x in (("q", q), ("k", k), ("v", v)):
                refuse_non_finite(name, x)
        if self.causal and q.shape[-2] != k.shape[-2]:
            raise ValueError(
                f"causal attention needs as many queries as keys: got {q.shape[-2]} and "
                f"{k.shape[-2]}"
            )
        if empty_problem(q, k, v):
            self._guards = {}
            return softmax_of_nothing(q, k, v, self.causal)
        out = self.attend(q, k, v)
        self.report_guards()
        return out

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:  # pragma: no cover
        raise NotImplementedError

    # --- autoregressive decoding (inference only: no autograd through the state) ---

    @torch.no_grad()
    def prefill(
        self, q: Tensor, k: Tensor, v: Tensor, capacity: int | None = None
    ) -> tuple[Tensor, object]:
        """Causal forward over a prompt q, k, v (B, H, n, d) and the decoding state after it.

        Returns the prompt's outputs (B, H, n, d_v) - the same as ``forward`` - and a state
        that :meth:`step` continues one token at a time. ``capacity`` (tokens) preallocates
        the state's buffers for the whole decode; they grow by doubling otherwise.
        """
        check_qkv(q, k, v, check_finite=self.check_inputs)
        if not self.causal:
            raise ValueError("prefill/step need a causal method: build it with causal=True")
        if q.shape[-2] != k.shape[-2]:
            raise ValueError(f"prefill needs as many queries as keys: {q.shape[-2]}, {k.shape[-2]}")
        check_capacity(capacity)
        if q.shape[-2] < 1:
            raise ValueError("prefill needs a prompt of at least one token (n >= 1)")
        out, state = self.attend_prefix(q, k, v, capacity)
        self.report_guards()
        return out, state

    @torch.no_grad()
    def step(self, q: Tensor, k: Tensor, v: Tensor, state: object) -> tuple[Tensor, object]:
        """One decoding step: q, k, v (B, H, 1, d) of the next token -> (B, H, 1, d_v), state.

        The output equals row ``t`` of the causal ``forward`` over all tokens so far.
        """
        check_qkv(q, k, v, check_finite=self.check_inputs)
        check_step(q, k, v)
        if not self.causal:
            raise ValueError("prefill/step need a causal method: build it with causal=True")
        check_state(k, v, state)
        out, state = self.attend_step(q, k, v, state)
        self.report_guards()
        return out, state

    def attend_prefix(
        self, q: Tensor, k: Tensor, v: Tensor, capacity: int | None
    ) -> tuple[Tensor, object]:  # pragma: no cover
        raise NotImplementedError(f"{type(self).__name__} does not support decoding")

    def attend_step(
        self, q: Tensor, k: Tensor, v: Tensor, state: object
    ) -> tuple[Tensor, object]:  # pragma: no cover
        raise NotImplementedError(f"{type(self).__name__} does not support decoding")

    def extra_repr(self) -> str:
        return f"causal={self.causal}"
