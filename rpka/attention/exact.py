"""Exact softmax attention through ``torch.nn.functional.scaled_dot_product_attention``."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from rpka.attention.base import AttentionMethod


class ExactAttention(AttentionMethod):
    """``softmax(q k^T / sqrt(d)) v`` (optionally causal), torch SDPA - the baseline.

    SDPA picks its fastest backend (flash / memory-efficient on a GPU).
    """

    name = "exact"

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
