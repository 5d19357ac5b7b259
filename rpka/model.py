"""``transformer_tiny``: a small encoder forecaster (and, in causal mode, a decoder LM), S
seeds trained as one stacked model.

Shapes: S ensemble members (one per seed), B windows, L context steps (= n tokens),
d = d_model, h heads of size d / h, H horizon steps.

    x (S, B, L)  --embed-->  (S, B, L, d)          one token per time step: a width-k
                                                   convolution of the values (local shape)
                 + positions (S, L, d)             learned
                 --n_layers x Block-->             pre-norm: x + Attn(LN(x)), x + MLP(LN(x))
                 --LN, flatten, linear-->  (S, B, H)
                 + linear skip  x -> (S, B, H)     RLinear-style, see below

**Stacked seeds.** Every parameter has a leading member dimension S
(:class:`EnsembleLinear` multiplies with ``torch.baddbmm``), and the attention is called
once on (S*B, h, L, d/h), so an RPKA pivot loop runs once for all seeds and heads. Members
never mix: each one's computation reads only its own slice, so S members trained together
give what S separate runs would (up to the RPKA pivot draws, which share one generator).
Member s is initialised from its own seed alone (:meth:`TransformerTiny.reset_parameters`).

**Linear skip.** The horizon is predicted as ``linear(x) + encoder(x)``, the linear path
being a context -> horizon map as in RLinear / DLinear (Zeng et al. 2023, "Are transformers
effective for time series forecasting?"). Windows are standardised by their context, so
this is exactly the model class of the least-squares linear baseline: with it the encoder
only has to learn what a linear forecast misses, and the model can match that baseline
early in training instead of having to rediscover a linear filter through attention.
``ModelConfig.linear_skip=False`` removes it (an ablation).

**Causal mode** (:class:`TransformerLM`, track ``lm``): the same blocks with causal
attention as a decoder, tokens (S, B, n) -> next-token logits (S, B, n, V):

    tokens (S, B, n) --embedding E (S, V, d)--> (S, B, n, d) + positions (S, n, d)
                     --n_layers x causal Block--> --LN--> h
                     logits = h E^T + bias        tied output head (Press & Wolf 2017)

Tying the head to the embedding means a layer that copies a token's embedding forward
scores that token - the copy half of the Markov-copy source needs exactly that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rpka.attention import build, options_of
from rpka.attention.rpka import new_batch, share_pivot_cache
from rpka.checks import is_int, is_number, require

READOUTS = ("flatten", "last")  # ModelConfig.readout


@dataclass(frozen=True)
class ModelConfig:
    """``transformer_tiny``: one token per time step, pre-norm blocks.

    On track ``forecast`` an encoder forecaster (``rpka.model.TransformerTiny``); on track
    ``lm`` the same blocks in causal mode as a decoder (``rpka.model.TransformerLM``).

    embed_kernel: width of the convolutional input embedding (odd; each token sees that
        many neighbouring values, which gives attention a local shape to match). Track
        ``lm`` requires 1: a token embeds only itself.
    linear_skip: add a linear context -> horizon path (RLinear-style) beside the encoder.
        Track ``lm`` requires False (there is no horizon to map to).
    previous_tokens: causal models only (``TransformerLM``): token t also embeds tokens
        t - 1 ... t - previous_tokens, one embedding table per offset - the token analogue
        of ``embed_kernel``, the short causal convolution of Zoology's MQAR models (Arora et
        al. 2023). With 1, a value token carries its key, so one attention layer can match a
        query against it; without it the model must first learn a previous-token head
        (measured: scripts/track_learnability.py, recall). 0 (default): a token embeds
        itself only. Encoder forecasters require 0 (``embed_kernel`` does this job there).
    head_init_std: standard deviation of the flatten head's initial weights (GPT-2's 0.02
        by default). Its fan-in is context x d_model, so the initial output's scale grows
        like the square root of the context: at 2,048 tokens 0.02 starts every forecast
        with a standard deviation of ~3.6 (MSE ~13 on standardised targets) that a short
        run cannot unlearn. 0 starts the model as its linear skip (a zero-initialised
        output layer, as in ReZero / Fixup); the long-context presets use it.
    readout: how the forecaster's head reads the encoder (``TransformerTiny``):
        ``"flatten"`` (default) maps all L tokens' features (L x d_model) to the horizon;
        ``"last"`` maps the last token's features (d_model) only, as a decoder reads its
        final position. The flatten head has L x d_model x horizon weights: at long context
        that is more features than a short run has training windows (at 512 tokens and
        d_model 16, 8,192 per horizon step against 4,000 windows), and its regression does
        not find the last token's answer (rpka.config.presets, long context); the last-token
        head's size does not grow with L, and everything it reads came through attention.
    """

    name: str = "transformer_tiny"
    d_model: int = 32
    n_layers: int = 2
    n_heads: int = 2
    d_ff: int = 64
    embed_kernel: int = 5
    dropout: float = 0.0
    linear_skip: bool = True
    head_init_std: float = 0.02
    previous_tokens: int = 0
    readout: str = "flatten"

    def validate(self) -> None:
        require(self.name == "transformer_tiny", "model.name", "'transformer_tiny'", self.name)
        for name in ("d_model", "n_layers", "n_heads", "d_ff"):
            value = getattr(self, name)
            require(is_int(value) and value >= 1, f"model.{name}", ">= 1", value)
        require(
            self.d_model % self.n_heads == 0,
            "model.d_model",
            f"a multiple of n_heads={self.n_heads}",
            self.d_model,
        )
        require(
            is_int(self.embed_kernel) and self.embed_kernel >= 1 and self.embed_kernel % 2 == 1,
            "model.embed_kernel",
            "an odd integer >= 1",
            self.embed_kernel,
        )
        require(
            is_number(self.dropout) and 0 <= self.dropout < 1,
            "model.dropout",
            "in [0, 1)",
            self.dropout,
        )
        require(isinstance(self.linear_skip, bool), "model.linear_skip", "a bool", self.linear_skip)
        require(
            is_number(self.head_init_std) and self.head_init_std >= 0,
            "model.head_init_std",
            ">= 0",
            self.head_init_std,
        )
        require(self.readout in READOUTS, "model.readout", f"one of {READOUTS}", self.readout)
        require(
            is_int(self.previous_tokens) and 0 <= self.previous_tokens <= 16,
            "model.previous_tokens",
            "an integer in [0, 16]",
            self.previous_tokens,
        )


# standard deviation of the initial positional embeddings (GPT-2 style; the output head's is
# ModelConfig.head_init_std)
INIT_STD = 0.02
# The attention numerics every committed study ran at: the float64 inference key side (the
# op's default "auto" is faster, equal up to float32 round-off; docs/numerics.md).
STUDY_NUMERICS = {"key_precision": "float64"}


def init_ensemble(module: nn.Module, seeds: list[int]) -> None:
    """Initialise member s of every ensemble layer in ``module`` from ``seeds[s]`` alone.

    Layers are visited in the module tree's fixed order, each drawing from one
    ``torch.Generator`` per member, so a member's parameters depend only on its seed
    (and the architecture), never on the other members or on global random state.
    """
    for s, seed in enumerate(seeds):
        generator = torch.Generator().manual_seed(seed)
        for layer in module.modules():
            if hasattr(layer, "init_member"):
                layer.init_member(s, generator)


class EnsembleLinear(nn.Module):
    """S independent linear maps: (S, ..., d_in) -> (S, ..., d_out).

    weight: (S, d_in, d_out), bias: (S, 1, d_out). Initialised like ``nn.Linear``
    (uniform in +-1/sqrt(d_in)) per member, or with normal(0, ``init_std``) if given.
    """

    def __init__(
        self,
        n_members: int,
        d_in: int,
        d_out: int,
        bias: bool = True,
        init_std: float | None = None,
    ) -> None:
        super().__init__()
        self.d_in, self.d_out, self.init_std = d_in, d_out, init_std
        self.weight = nn.Parameter(torch.empty(n_members, d_in, d_out))
        self.bias = nn.Parameter(torch.zeros(n_members, 1, d_out)) if bias else None
        init_ensemble(self, list(range(n_members)))  # placeholder: the owner re-seeds it

    @torch.no_grad()
    def init_member(self, s: int, generator: torch.Generator) -> None:
        if self.init_std is None:
            bound = 1 / math.sqrt(self.d_in)
            w = torch.rand(self.d_in, self.d_out, generator=generator) * 2 * bound - bound
        else:
            w = torch.randn(self.d_in, self.d_out, generator=generator) * self.init_std
        self.weight[s].copy_(w)
        if self.bias is not None:
            self.bias[s].zero_()

    def forward(self, x: Tensor) -> Tensor:
        n_members, *inner, d_in = x.shape
        flat = x.reshape(n_members, -1, d_in)
        if self.bias is None:
            out = torch.bmm(flat, self.weight)
        else:
            out = torch.baddbmm(self.bias, flat, self.weight)
        return out.reshape(n_members, *inner, self.d_out)


class EnsembleLayerNorm(nn.Module):
    """Layer norm over the last dimension with a per-member affine map: (S, ..., d)."""

    def __init__(self, n_members: int, d: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(n_members, d))
        self.bias = nn.Parameter(torch.zeros(n_members, d))

    @torch.no_grad()
    def init_member(self, s: int, generator: torch.Generator) -> None:
        self.weight[s].fill_(1.0)
        self.bias[s].zero_()

    def forward(self, x: Tensor) -> Tensor:
        shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (x.shape[-1],)
        normed = F.layer_norm(x, x.shape[-1:], eps=self.eps)
        return normed * self.weight.view(shape) + self.bias.view(shape)


class Block(nn.Module):
    """Pre-norm transformer block on (S, B, n, d): x + Attn(LN(x)), then x + MLP(LN(x)).

    ``method`` and ``options`` choose the attention (``rpka.attention.build``); ``causal``
    is passed to it (a causal LM builds on these blocks). A block initialises itself with
    placeholder seeds 0..S-1; a model built from blocks calls :func:`init_ensemble` with
    its members' seeds.
    """

    def __init__(
        self,
        n_members: int,
        d_model: int,
        n_heads: int,
        d_ff: int,
        method: str = "exact",
        options: dict | None = None,
        causal: bool = False,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.causal = causal
        self.norm_attn = EnsembleLayerNorm(n_members, d_model)
        self.qkv = EnsembleLinear(n_members, d_model, 3 * d_model)
        pinned = {k: v for k, v in STUDY_NUMERICS.items() if k in options_of(method)}
        self.attention = build(
            method, causal=causal, check_inputs=False, **{**pinned, **(options or {})}
        )
        self.proj = EnsembleLinear(n_members, d_model, d_model)
        self.norm_mlp = EnsembleLayerNorm(n_members, d_model)
        self.mlp_in = EnsembleLinear(n_members, d_model, d_ff)
        self.mlp_out = EnsembleLinear(n_members, d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(S, B, n, d) -> q, k, v each (S*B, h, n, d/h), as fed to the attention."""
        n_members, batch, n, d = x.shape
        qkv = self.qkv(self.norm_attn(x))  # (S, B, n, 3d)
        qkv = qkv.view(n_members * batch, n, 3, self.n_heads, d // self.n_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (S*B, h, n, d/h)
        return q, k, v

    def forward(self, x: Tensor) -> Tensor:
        n_members, batch, n, d = x.shape
        q, k, v = self.heads(x)
        att = self.attention(q, k, v)  # (S*B, h, n, d/h)
        att = att.transpose(1, 2).reshape(n_members, batch, n, d)
        x = x + self.dropout(self.proj(att))
        hidden = F.gelu(self.mlp_in(self.norm_mlp(x)))
        return x + self.dropout(self.mlp_out(hidden))


class EnsembleTransformer(nn.Module):
    """What the forecaster and the language model share: S members trained as one stack.

    A subclass sets ``seeds``, ``blocks`` and ``position`` and defines ``tokens(x)`` (its
    input embedding) and ``init_member`` (its own parameters of member s).
    """

    seeds: list[int]
    blocks: nn.ModuleList

    @property
    def n_members(self) -> int:
        return len(self.seeds)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Initialise member s from ``torch.Generator().manual_seed(seeds[s])`` only."""
        init_ensemble(self, self.seeds)

    def tokens(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    @torch.no_grad()
    def attention_inputs(self, x: Tensor) -> list[tuple[Tensor, Tensor, Tensor]]:
        """Per layer, the (q, k, v) fed to its attention, each (S*B, h, n, d/h)."""
        new_batch(self.attention_modules())
        h = self.tokens(x)
        inputs = []
        for block in self.blocks:
            inputs.append(block.heads(h))
            h = block(h)
        return inputs

    def attention_modules(self) -> list[nn.Module]:
        return [block.attention for block in self.blocks]


class TransformerTiny(EnsembleTransformer):
    """The forecaster: (S, B, L) standardised contexts -> (S, B, H) standardised horizons.

    Args:
        config: the model's shape (:class:`ModelConfig`).
        context, horizon: L and H.
        seeds: one per member; member s is initialised from ``seeds[s]`` alone.
        method, options: the attention method and its options, for every layer.
        causal: passed to every block's attention.
    """

    def __init__(
        self,
        config: ModelConfig,
        context: int,
        horizon: int,
        seeds: list[int],
        method: str = "exact",
        options: dict | None = None,
        causal: bool = False,
    ) -> None:
        super().__init__()
        config.validate()
        require(  # a forecaster's tokens see their neighbours through embed_kernel instead
            config.previous_tokens == 0,
            "model.previous_tokens",
            "0 for the forecaster (use embed_kernel)",
            config.previous_tokens,
        )
        n_members = len(seeds)
        d = config.d_model
        self.config, self.context, self.horizon = config, context, horizon
        self.seeds = list(seeds)
        self.embed = EnsembleLinear(n_members, config.embed_kernel, d)
        self.position = nn.Parameter(torch.empty(n_members, context, d))
        self.blocks = nn.ModuleList(
            Block(
                n_members, d, config.n_heads, config.d_ff, method, options, causal, config.dropout
            )
            for _ in range(config.n_layers)
        )
        self.norm_out = EnsembleLayerNorm(n_members, d)
        read = d if config.readout == "last" else context * d
        self.head = EnsembleLinear(n_members, read, horizon, init_std=config.head_init_std)
        self.skip = EnsembleLinear(n_members, context, horizon) if config.linear_skip else None
        # RPKA with pivot_refresh="batch": one pivot draw per forward, shared by the layers
        share_pivot_cache(self.attention_modules())
        self.reset_parameters()

    @torch.no_grad()
    def init_member(self, s: int, generator: torch.Generator) -> None:
        # called first by init_ensemble (the root of the module tree), then the layers
        shape = (self.context, self.config.d_model)
        self.position[s].copy_(torch.randn(shape, generator=generator) * INIT_STD)

    def tokens(self, x: Tensor) -> Tensor:
        """(S, B, L) -> (S, B, L, d): each token embeds its ``embed_kernel`` neighbours."""
        half = self.config.embed_kernel // 2
        padded = F.pad(x, (half, half))  # zeros = the context mean after standardisation
        patches = padded.unfold(-1, self.config.embed_kernel, 1)  # (S, B, L, k)
        return self.embed(patches) + self.position.unsqueeze(1)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 3 or x.shape[0] != self.n_members or x.shape[-1] != self.context:
            raise ValueError(
                f"x must have shape (S={self.n_members}, B, L={self.context}), got {tuple(x.shape)}"
            )
        new_batch(self.attention_modules())  # a forward pass is one batch
        h = self.tokens(x)
        for block in self.blocks:
            h = block(h)
        h = self.norm_out(h)
        # (S, B, d) the last token, or (S, B, L * d) every token
        out = self.head(h[..., -1, :] if self.config.readout == "last" else h.flatten(-2))
        if self.skip is not None:
            out = out + self.skip(x)
        return out


class EnsembleEmbedding(nn.Module):
    """S independent token embeddings: tokens (S, ...) int -> (S, ..., d); weight (S, V, d).

    Initialised normal(0, ``INIT_STD``) per member (GPT-2 style).
    """

    def __init__(self, n_members: int, n_tokens: int, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_members, n_tokens, d))
        init_ensemble(self, list(range(n_members)))  # placeholder: the owner re-seeds it

    @torch.no_grad()
    def init_member(self, s: int, generator: torch.Generator) -> None:
        shape = self.weight.shape[1:]
        self.weight[s].copy_(torch.randn(shape, generator=generator) * INIT_STD)

    def forward(self, tokens: Tensor) -> Tensor:
        members = torch.arange(tokens.shape[0], device=tokens.device)
        members = members.view(-1, *([1] * (tokens.dim() - 1)))
        return self.weight[members, tokens]


class TransformerLM(EnsembleTransformer):
    """``transformer_tiny`` in causal mode: (S, B, n) tokens -> (S, B, n, V) logits.

    Logit ``[s, b, t]`` is member s's prediction of token t + 1 from tokens 0..t only (every
    block's attention is built with ``causal=True``; everything else acts per position).

    Args:
        config: the model's shape (``embed_kernel`` and ``linear_skip`` do not apply;
            ``previous_tokens`` adds one embedding table per earlier offset).
        n_tokens: vocabulary size V.
        max_len: the longest input n (learned positions).
        seeds: one per member; member s is initialised from ``seeds[s]`` alone.
        method, options: the attention method and its options, for every layer; the method
            must support ``causal=True`` (``exact``, ``rpka``).
    """

    def __init__(
        self,
        config: ModelConfig,
        n_tokens: int,
        max_len: int,
        seeds: list[int],
        method: str = "exact",
        options: dict | None = None,
    ) -> None:
        super().__init__()
        config.validate()
        for name, value in (("n_tokens", n_tokens), ("max_len", max_len)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        n_members = len(seeds)
        d = config.d_model
        self.config, self.n_tokens, self.max_len = config, n_tokens, max_len
        self.seeds = list(seeds)
        self.embed = EnsembleEmbedding(n_members, n_tokens, d)
        self.position = nn.Parameter(torch.empty(n_members, max_len, d))
        self.blocks = nn.ModuleList(
            Block(n_members, d, config.n_heads, config.d_ff, method, options, True, config.dropout)
            for _ in range(config.n_layers)
        )
        self.norm_out = EnsembleLayerNorm(n_members, d)
        self.head_bias = nn.Parameter(torch.zeros(n_members, 1, n_tokens))
        # registered last: with previous_tokens = 0 every other parameter initialises as before
        self.previous = nn.ModuleList(
            EnsembleEmbedding(n_members, n_tokens, d) for _ in range(config.previous_tokens)
        )
        self.reset_parameters()

    @torch.no_grad()
    def init_member(self, s: int, generator: torch.Generator) -> None:
        # called first by init_ensemble (the root of the module tree), then the layers
        shape = (self.max_len, self.config.d_model)
        self.position[s].copy_(torch.randn(shape, generator=generator) * INIT_STD)
        self.head_bias[s].zero_()

    def tokens(self, x: Tensor) -> Tensor:
        """(S, B, n) token ids -> (S, B, n, d): embedding plus learned position, plus the
        embeddings of the ``previous_tokens`` earlier tokens (token 0 before the start)."""
        n = x.shape[-1]
        h = self.embed(x) + self.position[:, :n].unsqueeze(1)
        for offset, table in enumerate(self.previous, 1):
            h = h + table(F.pad(x, (offset, 0))[..., :n])  # token t - offset
        return h

    def forward(self, x: Tensor) -> Tensor:
        if (
            x.dim() != 3
            or x.shape[0] != self.n_members
            or not 1 <= x.shape[-1] <= self.max_len
            or x.dtype not in (torch.int64, torch.int32)
        ):
            raise ValueError(
                f"x must be integer tokens of shape (S={self.n_members}, B, n <= "
                f"{self.max_len}), got {tuple(x.shape)} {x.dtype}"
            )
        h = self.tokens(x)
        for block in self.blocks:
            h = block(h)
        h = self.norm_out(h)  # (S, B, n, d)
        n_members, batch, n, d = h.shape
        logits = torch.baddbmm(  # tied head: h E^T + bias, (S, B*n, V)
            self.head_bias, h.reshape(n_members, batch * n, d), self.embed.weight.transpose(1, 2)
        )
        return logits.view(n_members, batch, n, self.n_tokens)
