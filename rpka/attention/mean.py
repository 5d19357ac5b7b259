"""Uniform attention: every query averages the values (causal: the values so far).

A control, not an approximation: softmax attention with q = 0, so queries and keys are
ignored. In the bench it measures how much a track needs attention at all - on a track
where this control ties with exact attention, no approximation of attention can be told
apart from exact either.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rpka.attention.base import AttentionMethod


class MeanAttention(AttentionMethod):
    """``out[t] = mean_s v[s]`` over every key s (causal: s <= t). O(n d) time and memory."""

    name = "mean"

    def __init__(self, causal: bool = False, check_inputs: bool = True) -> None:
        super().__init__(causal=causal, check_inputs=check_inputs)

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if self.causal:  # the running mean: position t averages v[0..t]
            counts = torch.arange(1, v.shape[-2] + 1, device=v.device, dtype=torch.float32)
            return (v.float().cumsum(-2) / counts.unsqueeze(-1)).to(v.dtype)
        mean = v.float().mean(-2, keepdim=True).to(v.dtype)  # (B, H, 1, d_v)
        return mean.expand(*q.shape[:-1], v.shape[-1]).contiguous()
