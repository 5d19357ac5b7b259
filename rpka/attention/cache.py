"""Decoding state shared by every method: growing token buffers and the exact KV cache.

A decoder appends one token per step. Concatenating onto a tensor copies the whole
history every step (O(n) per token); :class:`GrowingBuffer` keeps spare capacity and
doubles it when full, so an append is amortised O(1) and a step that only reads the
buffer (``view``) never copies it.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


class GrowingBuffer:
    """Tokens along dim -2 of a (..., capacity, d) tensor; ``view()`` is (..., length, d)."""

    def __init__(self, first: Tensor, capacity: int | None = None) -> None:
        length = first.shape[-2]
        capacity = max(int(capacity or 0), 2 * length, 16)
        self.data = first.new_empty(*first.shape[:-2], capacity, first.shape[-1])
        self.data[..., :length, :] = first
        self.length = length

    def append(self, rows: Tensor) -> None:
        """Add rows (..., m, d) at the end, doubling the capacity when it runs out."""
        end = self.length + rows.shape[-2]
        if end > self.data.shape[-2]:
            grown = self.data.new_empty(*self.data.shape[:-2], 2 * end, self.data.shape[-1])
            grown[..., : self.length, :] = self.view()
            self.data = grown
        self.data[..., self.length : end, :] = rows
        self.length = end

    def view(self, start: int = 0, stop: int | None = None) -> Tensor:
        """The stored rows ``start:stop`` (default: all), without a copy."""
        stop = self.length if stop is None else stop
        return self.data[..., start:stop, :]


@dataclass
class KVCache:
    """Decoding state of exact attention: every key and value so far."""

    keys: GrowingBuffer
    values: GrowingBuffer

    @property
    def length(self) -> int:
        return self.keys.length


def check_step(q: Tensor, k: Tensor, v: Tensor) -> None:
    """A decoding step takes exactly one new token: q, k, v of shape (B, H, 1, d)."""
    if q.shape[-2] != 1 or k.shape[-2] != 1 or v.shape[-2] != 1:
        raise ValueError(
            "step takes one token: q, k, v must have length 1 along dim -2, got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )


def check_state(k: Tensor, v: Tensor, state: object) -> None:
    """The new token continues ``state``: its batch, heads and head dimensions are the
    prompt's (a mismatch was a ``RuntimeError`` deep in a buffer copy)."""
    keys, values = getattr(state, "keys", None), getattr(state, "values", None)
    if not isinstance(keys, GrowingBuffer) or not isinstance(values, GrowingBuffer):
        return  # not a decoding state at all: the method's own check names its type
    for name, new, buffer in (("k", k, keys), ("v", v, values)):
        expected = (*buffer.data.shape[:-2], buffer.data.shape[-1])
        got = (*new.shape[:-2], new.shape[-1])
        if got != expected:
            raise ValueError(
                f"step: {name} of shape {tuple(new.shape)} does not continue the state: "
                f"(batch, heads, head dim) must be the prompt's {expected}, got {got}"
            )


def check_capacity(capacity: int | None) -> None:
    if capacity is not None and (
        not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1
    ):
        raise ValueError(f"capacity must be a positive integer or None, got {capacity!r}")
