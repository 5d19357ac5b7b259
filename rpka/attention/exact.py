"""Exact softmax attention through ``torch.nn.functional.scaled_dot_product_attention``."""

from __future__ import annotations

import contextlib

import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from rpka.attention.base import AttentionMethod
from rpka.attention.cache import GrowingBuffer, KVCache

# SDPA backends one can pin (None: let SDPA choose its fastest available one)
SDPA_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}


class ExactAttention(AttentionMethod):
    """``softmax(q k^T / sqrt(d)) v`` (optionally causal), torch SDPA - the baseline.

    Options:
        backend: None (SDPA picks its fastest backend: flash / memory-efficient on a GPU)
            or one of ``"flash"``, ``"efficient"``, ``"cudnn"``, ``"math"`` to pin it with
            ``torch.nn.attention.sdpa_kernel`` (an unsupported input then raises).

    Decoding keeps a KV cache: a step attends its one query to every key so far, O(t d) at
    position t.
    """

    name = "exact"

    def __init__(
        self, backend: str | None = None, causal: bool = False, check_inputs: bool = True
    ) -> None:
        super().__init__(causal=causal, check_inputs=check_inputs)
        if backend is not None and backend not in SDPA_BACKENDS:
            raise ValueError(
                f"backend must be None or one of {sorted(SDPA_BACKENDS)}, got {backend!r}"
            )
        self.backend = backend

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        pin = sdpa_kernel(SDPA_BACKENDS[self.backend]) if self.backend else contextlib.nullcontext()
        with pin:
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)

    def attend_prefix(
        self, q: Tensor, k: Tensor, v: Tensor, capacity: int | None
    ) -> tuple[Tensor, KVCache]:
        cache = KVCache(GrowingBuffer(k, capacity), GrowingBuffer(v, capacity))
        return self.attend(q, k, v), cache

    def attend_step(
        self, q: Tensor, k: Tensor, v: Tensor, state: KVCache
    ) -> tuple[Tensor, KVCache]:
        if not isinstance(state, KVCache):
            raise ValueError(f"state must be the KVCache from prefill, got {type(state).__name__}")
        state.keys.append(k)
        state.values.append(v)
        # the one new query sees every cached key: no mask needed
        return F.scaled_dot_product_attention(q, state.keys.view(), state.values.view()), state
