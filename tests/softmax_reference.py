"""Exact softmax attention in float64, written from the definition: the independent
reference the numerics tests compare the package's estimates with (not the package's own
exact method)."""

import torch


def softmax_attention(q, k, v, causal=False):
    """softmax(q k^T / sqrt(d)) v in float64, from the definition; q (..., n, d),
    k (..., m, d), v (..., m, d_v); ``causal`` masks keys after each query."""
    q, k, v = (x.double() for x in (q, k, v))
    logits = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        future = torch.ones(logits.shape[-2:], dtype=torch.bool).triu(1)
        logits = logits.masked_fill(future, float("-inf"))
    return torch.softmax(logits, -1) @ v
