"""A model that is not the project's: a small causal language model on
``nn.TransformerEncoder``, trained on the project's ``lm`` source (notebook 07, the tests,
and the command line's example ``--model rpka.swap.example:encoder_lm``).

Its attention runs through ``nn.MultiheadAttention``, which calls torch SDPA (with
``is_causal=True``) whenever the encoder's fused fast path is off - in train mode, or with
gradients on - so :func:`rpka.swap.swap` reaches it without an edit.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rpka.tracks.lm import build_arrays
from rpka.tracks.lm_source import LMConfig


class EncoderLM(nn.Module):
    """Tokens (B, n) -> next-token logits (B, n, V): embedding + learned positions,
    ``n_layers`` pre-norm ``nn.TransformerEncoderLayer`` with a causal mask, a linear head.
    """

    def __init__(
        self, n_tokens: int, max_len: int, d_model: int = 32, n_heads: int = 2, n_layers: int = 2
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(n_tokens, d_model)
        self.position = nn.Parameter(torch.randn(max_len, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(
            d_model, n_heads, 2 * d_model, dropout=0.0, batch_first=True, norm_first=True
        )
        # nested tensors are the fast path's; this model always takes the SDPA path
        self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, n_tokens)

    def forward(self, tokens: Tensor) -> Tensor:
        n = tokens.shape[-1]
        h = self.embed(tokens) + self.position[:n]
        mask = nn.Transformer.generate_square_subsequent_mask(n, device=tokens.device)
        return self.head(self.encoder(h, mask=mask, is_causal=True))


def encoder_lm(n_tokens: int = 51, max_len: int = 64) -> EncoderLM:
    """The command line's factory: an untrained :class:`EncoderLM` (load weights on it),
    in train mode with dropout 0 (the SDPA path)."""
    torch.manual_seed(0)
    return EncoderLM(n_tokens, max_len)


def source_config(seq_len: int = 65, n_train: int = 512, seed: int = 0) -> LMConfig:
    """The ``lm`` track's Markov-copy source with short lags (a small model learns the
    copies in a minute): 48 content tokens and 3 markers."""
    return LMConfig(
        vocab_size=48,
        lags=(8, 16, 32),
        seq_len=seq_len,
        n_train=n_train,
        n_val=64,
        n_test=64,
        seed=seed,
    )


def lm_source(config: LMConfig) -> dict[str, Tensor]:
    """Token sequences (N, seq_len) int64 of ``config``'s source, per split."""
    arrays = build_arrays(config)
    return {split: torch.from_numpy(np.asarray(arrays[split])) for split in ("train", "test")}


def next_token_loss(logits: Tensor, tokens: Tensor) -> Tensor:
    """Mean cross-entropy of logits (B, n, V) for inputs ``tokens[:, :-1]`` against
    ``tokens[:, 1:]`` (B, n)."""
    return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())


def train_encoder_lm(
    seconds: float = 60.0, steps: int = 10_000, batch_size: int = 32, seed: int = 0
) -> tuple[EncoderLM, dict[str, Tensor], list[float]]:
    """Train an :class:`EncoderLM` on :func:`lm_source` for ``seconds`` of wall time or
    ``steps`` steps (whichever ends first); returns the model (train mode), the data and
    the loss per step."""
    config = source_config(seed=seed)
    data = lm_source(config)
    torch.manual_seed(seed)
    model = EncoderLM(config.n_tokens, config.seq_len - 1)
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses: list[float] = []
    start = time.perf_counter()
    generator = torch.Generator().manual_seed(seed)
    while len(losses) < steps and time.perf_counter() - start < seconds:
        rows = torch.randint(len(data["train"]), (batch_size,), generator=generator)
        tokens = data["train"][rows]
        loss = next_token_loss(model(tokens[:, :-1]), tokens)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    return model, data, losses


def perplexity(logits: Tensor, tokens: Tensor) -> float:
    """exp of :func:`next_token_loss` (the end metric the notebook audits)."""
    return math.exp(float(next_token_loss(logits, tokens)))
