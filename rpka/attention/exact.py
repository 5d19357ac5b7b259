"""Exact softmax attention through ``torch.nn.functional.scaled_dot_product_attention``."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from rpka.attention.base import AttentionMethod
from rpka.attention.cache import GrowingBuffer, KVCache


class ExactAttention(AttentionMethod):
    """``softmax(q k^T / sqrt(d)) v`` (optionally causal), torch SDPA - the baseline.

    SDPA picks its fastest backend (flash / memory-efficient on a GPU). Decoding keeps a
    KV cache: a step attends its one query to every key so far, O(t d) at position t.
    """

    name = "exact"

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
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
