"""Sliding-window softmax attention: each query sees only the keys near it.

A control, not an approximation of full attention: ``exact`` restricted to a band of
``window`` keys. In the bench it measures how far back a track looks - on a track where
this control ties with exact attention at window w, nothing past w keys matters.

Band (query i, key j, both counted from 0; ``w = window``):

- causal: ``i - w < j <= i`` - the last w keys up to and including the query's own;
- non-causal: ``|i - j| < w`` - a symmetric band, w - 1 keys each side plus its own.

Both need as many queries as keys (n == m): the band is defined by position, and with
n != m the positions of queries and keys would not match (``ValueError`` otherwise). With
``w >= n`` the band holds every key (causal: every key so far) and the result is exact
attention. Each row sees at least its own key, so no row is ever empty.

Implementation: for long sequences the queries are cut into blocks of ``BLOCK`` rows;
each block attends, in one batched SDPA call, to the ``reach = BLOCK + w - 1`` (causal)
or ``BLOCK + 2(w - 1)`` (non-causal) keys its band can reach - a strided view of the
padded keys - so time and memory are O(n (BLOCK + w) d) instead of O(n^2 d). When the
reach exceeds n / 4 (short sequences, wide bands: ``uses_blocks``) one SDPA call with a
dense (n, n) boolean band mask is faster; ``w >= n`` is plain SDPA. Measured on the CPU
(torch 2.13, 1 thread on a shared 2-core machine, so +-30 %; float32, B*H = 8,
n = 2048, w = 128, d = 16, median of 7, two runs):

    ms                   dense band mask   blocked (BLOCK = 64)   exact SDPA (no band)
    causal forward           69 - 94             15 - 18               23 - 28
    causal fwd+bwd          181 - 303            30 - 65               87 - 110
    non-causal forward       66 - 67             23 - 24               36 - 51
    non-causal fwd+bwd      174 - 183            50 - 54              129 - 190

The dense band mask is slower than exact attention itself: with an explicit mask SDPA
does all n^2 logits plus the mask, with ``is_causal`` it skips the masked half. The
n / 4 switch: on a grid n = 512 - 2048, w = 16 - 256 (forward, same setting), blocks won
wherever 4 reach <= n, and above it the dense call won by up to 10x (n = 512, w = 256,
non-causal: 35 ms blocked, 3.4 dense) - except causal bands at n = 512 - 1024 with
w = 128 - 256, near the line, within the noise (e.g. 4 vs 7.5 ms, yet w = 200: 9.5 vs
3.2); at n <= 256 the dense call won for every w tried (8 - 16).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from rpka.attention.base import AttentionMethod, check_qkv
from rpka.attention.options import check_positive_int

BLOCK = 64  # query rows per block (measured: 32-64 fastest at w = 128 on the CPU; 256 slower)


def band_mask(n: int, window: int, causal: bool, device: torch.device) -> Tensor:
    """(n, n) boolean mask, True where query i may attend key j."""
    offset = torch.arange(n, device=device).unsqueeze(-1) - torch.arange(n, device=device)
    if causal:  # offset = i - j in [0, w)
        return (offset >= 0) & (offset < window)
    return offset.abs() < window


def dense_band(q: Tensor, k: Tensor, v: Tensor, window: int, causal: bool) -> Tensor:
    """Band attention with one SDPA call and a dense (n, n) mask: O(n^2 d)."""
    mask = band_mask(q.shape[-2], window, causal, q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def reach(window: int, causal: bool) -> int:
    """Keys a block of ``BLOCK`` queries can see: w - 1 before it, and after it too unless
    causal."""
    return BLOCK + (window - 1) * (1 if causal else 2)


def uses_blocks(n: int, window: int, causal: bool) -> bool:
    """Whether ``LocalAttention`` takes the blocked path for n queries (module docstring).

    Blocks pay off once the keys they reach are a quarter of the sequence or less: per
    entry, the batched strided blocks cost ~2-4x the one dense call (measured, n = 512 -
    2048 on the CPU), so below that their O(n reach d) does not beat O(n^2 d).
    """
    return 4 * reach(window, causal) <= n


def blocked_band(q: Tensor, k: Tensor, v: Tensor, window: int, causal: bool) -> Tensor:
    """Band attention by query blocks, each against the keys it can reach: O(n (b + w) d).

    q, k, v: (B, H, n, d) with n == m -> (B, H, n, d_v).
    """
    n, block, span = q.shape[-2], BLOCK, reach(window, causal)
    blocks = -(-n // block)  # ceil
    pad_q = blocks * block - n
    # keys padded so that block b's keys are rows [b * block, b * block + span) of k_pad
    pad_k = (window - 1, pad_q + span - block - (window - 1))
    q_blocks = F.pad(q, (0, 0, 0, pad_q)).unflatten(-2, (blocks, block))  # (B, H, nb, b, d)
    k_blocks = F.pad(k, (0, 0, *pad_k)).unfold(-2, span, block).transpose(-1, -2)
    v_blocks = F.pad(v, (0, 0, *pad_k)).unfold(-2, span, block).transpose(-1, -2)
    out = F.scaled_dot_product_attention(
        q_blocks, k_blocks, v_blocks, attn_mask=block_mask(n, window, causal, blocks, q.device)
    )
    return out.flatten(-3, -2)[..., :n, :]


def block_mask(n: int, window: int, causal: bool, blocks: int, device: torch.device) -> Tensor:
    """(blocks, BLOCK, span) mask of ``blocked_band``: the band, minus padded keys.

    A padded query row (i >= n, dropped afterwards) attends to every real key of its
    block instead, so that no row is empty: an empty softmax row is nan, and a nan would
    reach the keys' gradients through the backward pass.
    """
    start = torch.arange(blocks, device=device).view(-1, 1, 1) * BLOCK
    i = start + torch.arange(BLOCK, device=device).view(1, -1, 1)  # query positions
    j = start - (window - 1) + torch.arange(reach(window, causal), device=device)  # keys
    real_key = (j >= 0) & (j < n)
    offset = i - j
    band = (offset >= 0) & (offset < window) if causal else offset.abs() < window
    return real_key & (band | (i >= n))


class LocalAttention(AttentionMethod):
    """Softmax attention over a band of ``window`` keys (module docstring: the band).

    Options:
        window: positive integer, the band's reach w (default 64): causal, the last w keys
            up to the query; non-causal, keys within distance w - 1 either side.

    Shapes: q, k, v (B, H, n, d) with n == m -> (B, H, n, d_v), in the input dtype.
    """

    name = "local"

    def __init__(self, window: int = 64, causal: bool = False, check_inputs: bool = True) -> None:
        super().__init__(causal=causal, check_inputs=check_inputs)
        self.window = check_positive_int("window", window)

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        # shapes first (without the finiteness pass, which the base class does once)
        check_qkv(q, k, v, check_finite=False)
        if q.shape[-2] != k.shape[-2]:
            raise ValueError(
                "local attention needs as many queries as keys (its band is defined by "
                f"position): got q with n={q.shape[-2]} and k with m={k.shape[-2]}"
            )
        if q.shape[-1] == 0:
            # d = 0: every logit is 0 and each row averages its band; the base class's
            # shortcut would average every key, so give SDPA one zero feature instead
            q, k = F.pad(q, (0, 1)), F.pad(k, (0, 1))
        return super().forward(q, k, v)

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        n = q.shape[-2]
        if self.window >= n:  # the band holds every key (so far): exact attention
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        if uses_blocks(n, self.window, self.causal):
            return blocked_band(q, k, v, self.window, self.causal)
        return dense_band(q, k, v, self.window, self.causal)  # blocks would not pay off

    def extra_repr(self) -> str:
        return f"window={self.window}, causal={self.causal}"
