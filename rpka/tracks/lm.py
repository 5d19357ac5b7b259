"""Track ``lm``: text from a seeded Markov source with copies, whose entropy is known exactly;
its config and its :class:`LMTask` (docs/design.md, "Tracks"; issue 7).

A language model's perplexity has a floor: the entropy rate of the source. Here it is
computed exactly, so every arm's perplexity can be reported next to the floor and the gap
read off.

**The source** ("Markov text with copies"). Tokens ``0 .. V-1`` are content, ``V .. V+K-1``
are K copy markers, marker ``m`` with its own lag ``D_m``. Every position is in one of two
*modes*, decided by the tokens before it:

* fresh: the next token depends on the previous ``order`` tokens ``c``: with probability
  ``p`` a marker, uniform over the ``K_t`` markers available at position t (those with
  ``D_m <= t``; if none, ``p`` is 0), else a content token ``x ~ P[c, :]``;
* copy: after marker ``m`` at position ``t0``, the next ``s`` positions repeat the token
  ``D_m`` positions back: ``x_t = x_{t - D_m}`` (literally - a copied marker starts nothing).

The first ``order`` tokens are uniform over content. Copies make the process non-Markov
with long-range structure - predicting a copy needs the token ``D_m`` back, up to the
longest lag, which is what attention is for - and the mode is a function of the past, so a
perfect predictor knows it.

**Exact entropy.** Every row of ``P`` is a permutation of one base distribution ``b``
(drawn from a Dirichlet), so every fresh content step has the same entropy
``h_P = -sum_j b_j log b_j`` whatever the context. A fresh step with markers available has
entropy ``h_F(t) = H2(p) + p log K_t + (1 - p) h_P``; a copy step has entropy 0. The
entropy of ``x_t`` given the past therefore depends on the mode only, and the modes form
a Markov chain of their own - fresh -> copy_1 (probability ``p``) -> ... -> copy_s -> fresh
- independent of the tokens. Its stationary distribution ``pi`` (from its transition
matrix) gives the entropy rate exactly, the Markov-chain formula over mode states:

    H = sum_states pi_state H(x | state) = pi_fresh h_F = h_F / (1 + p s)      [nats/token]

and propagating the mode distribution from position 0 gives the exact expected entropy
``E[h_t]`` of every position, hence the exact floor of a fixed-length sequence:
``floor = mean_{t=1..L-1} E[h_t]`` (the loss of the Bayes-optimal predictor of
``x_1 .. x_{L-1}``, in expectation; it sits a little above ``H`` because early positions
have fewer markers available). Perplexity floor: ``exp(floor)``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import scipy.linalg
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rpka.checks import is_int, is_number, require
from rpka.model import TransformerLM
from rpka.tracks.base import CausalTokenTask
from rpka.tracks.cache import cached_arrays


@dataclass(frozen=True)
class LMConfig:
    """Track ``lm``: the seeded Markov-copy source and its splits (``rpka.tracks.lm``).

    Tokens ``0 .. vocab_size-1`` are content, then one copy marker per lag in ``lags``:
    after marker m the next ``copy_length`` tokens repeat the token ``lags[m]`` positions
    back. Fresh positions draw a marker with probability ``marker_prob``, else content from
    an ``order``-th order Markov chain whose rows are permutations of one Dirichlet
    (``concentration``) distribution - so the entropy rate, hence the perplexity floor, is
    exact. ``n_train`` / ``n_val`` / ``n_test`` sequences of ``seq_len`` tokens each; a
    model reads tokens 0..L-2 and predicts 1..L-1, so attention sees ``seq_len - 1`` tokens.
    """

    vocab_size: int = 48  # content tokens V (markers come on top)
    lags: tuple[int, ...] = (16, 32, 64, 128)  # one copy marker per lag
    copy_length: int = 8  # s
    marker_prob: float = 0.05  # p
    order: int = 1  # context length of the content Markov chain
    concentration: float = 0.3  # Dirichlet concentration of the base distribution b
    seq_len: int = 256
    n_train: int = 2048
    n_val: int = 256
    n_test: int = 256
    seed: int = 0
    name: str = field(default="lm", repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.lags, list):  # e.g. from JSON: store the hashable form
            object.__setattr__(self, "lags", tuple(self.lags))

    @property
    def n_tokens(self) -> int:
        """Vocabulary size of a model: content tokens plus markers."""
        return self.vocab_size + len(self.lags)

    @property
    def attention_tokens(self) -> int:
        """Tokens one attention call sees: inputs 0..L-2 predict 1..L-1."""
        return self.seq_len - 1

    def validate(self) -> None:
        def at_least(name: str, low: int) -> None:
            value = getattr(self, name)
            require(
                is_int(value) and value >= low, f"track.{name}", f"an integer >= {low}", value
            )

        require(self.name == "lm", "track.name", "'lm'", self.name)
        at_least("vocab_size", 2)
        at_least("copy_length", 1)
        at_least("seq_len", 2)
        for name in ("n_train", "n_val", "n_test"):
            at_least(name, 1)
        at_least("seed", 0)
        require(
            is_int(self.order) and 1 <= self.order <= 3, "track.order", "1, 2 or 3", self.order
        )
        require(
            isinstance(self.lags, tuple) and len(self.lags) >= 1,
            "track.lags",
            "a non-empty tuple of integers",
            self.lags,
        )
        for lag in self.lags:
            require(is_int(lag) and lag >= 1, "track.lags: each lag", "an integer >= 1", lag)
        require(
            is_number(self.marker_prob) and 0.0 <= self.marker_prob < 1.0,
            "track.marker_prob",
            "in [0, 1)",
            self.marker_prob,
        )
        require(
            is_number(self.concentration) and self.concentration > 0,
            "track.concentration",
            "> 0",
            self.concentration,
        )



SPLITS = ("train", "val", "test")
MODES = {"init": 0, "fresh": 1, "copy": 2}


def entropy(probs: np.ndarray) -> np.ndarray:
    """Shannon entropy in nats along the last axis (0 log 0 = 0)."""
    logs = np.log(np.where(probs > 0, probs, 1.0))
    return -(probs * logs).sum(-1)


class MarkovCopySource:
    """The seeded source of the module docstring: sampling, exact log-probs and entropies."""

    def __init__(self, config: LMConfig) -> None:
        config.validate()
        self.config = config
        rng = np.random.default_rng(np.random.SeedSequence([config.seed, 0]))
        v, n_ctx = config.vocab_size, config.n_tokens**config.order
        self.base = rng.dirichlet(np.full(v, config.concentration))
        perms = np.argsort(rng.random((n_ctx, v)), axis=1)  # a random permutation per row
        self.transition = np.empty((n_ctx, v))
        np.put_along_axis(self.transition, perms, np.broadcast_to(self.base, (n_ctx, v)), axis=1)
        self.lags = np.asarray(config.lags)

    # --- exact quantities -----------------------------------------------------------

    @cached_property
    def content_entropy(self) -> float:
        """``h_P``: the entropy of every row of ``P`` (they are permutations of one row)."""
        return float(entropy(self.base))

    def markers_available(self, t: int) -> int:
        """``K_t``: how many markers may be emitted at position t."""
        return int((self.lags <= t).sum())

    def fresh_entropy(self, t: int) -> float:
        """``h_F(t)``: entropy of a fresh step at position t."""
        k_t = self.markers_available(t)
        if k_t == 0:
            return self.content_entropy
        p = self.config.marker_prob
        return float(
            entropy(np.array([p, 1 - p])) + p * np.log(k_t) + (1 - p) * self.content_entropy
        )

    def mode_transition(self, t: int) -> np.ndarray:
        """Transition matrix of the mode chain from position t to t + 1.

        States: 0 = fresh, i = the i-th copy position (1..s).
        """
        s = self.config.copy_length
        p = self.config.marker_prob if self.markers_available(t) > 0 else 0.0
        matrix = np.zeros((s + 1, s + 1))
        matrix[0, 0], matrix[0, 1] = 1 - p, p
        for i in range(1, s):
            matrix[i, i + 1] = 1.0
        matrix[s, 0] = 1.0
        return matrix

    def stationary_modes(self) -> np.ndarray:
        """Stationary distribution of the mode chain once every marker is available."""
        matrix = self.mode_transition(int(self.lags.max()))
        null = scipy.linalg.null_space((matrix - np.eye(len(matrix))).T)[:, 0]
        return null / null.sum()

    def entropy_rate(self) -> float:
        """``H = sum_states pi_state H(x | state)``: only fresh states carry entropy."""
        return float(self.stationary_modes()[0] * self.fresh_entropy(int(self.lags.max())))

    def expected_entropies(self, length: int) -> np.ndarray:
        """``E[h_t]`` for t = 0 .. length-1: the exact expected conditional entropy of x_t."""
        order, s = self.config.order, self.config.copy_length
        out = np.empty(length)
        out[: min(order, length)] = np.log(self.config.vocab_size)  # uniform start
        modes = np.zeros(s + 1)
        modes[0] = 1.0  # position `order` is fresh
        for t in range(order, length):
            out[t] = modes[0] * self.fresh_entropy(t)
            modes = modes @ self.mode_transition(t)
        return out

    def floor(self, length: int) -> float:
        """Exact expected mean loss (nats) of the best predictor of x_1 .. x_{length-1}."""
        return float(self.expected_entropies(length)[1:].mean())

    # --- sampling ---------------------------------------------------------------------

    def context_index(self, tokens: np.ndarray) -> np.ndarray:
        """Index of the context (N, order) in the rows of ``transition``."""
        index = np.zeros(tokens.shape[0], dtype=np.int64)
        for column in range(tokens.shape[1]):
            index = index * self.config.n_tokens + tokens[:, column]
        return index

    def sample(
        self, n_seq: int, length: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """``n_seq`` sequences of ``length`` tokens, and the mode of every position."""
        cfg = self.config
        tokens = np.zeros((n_seq, length), dtype=np.int64)
        modes = np.full((n_seq, length), MODES["init"], dtype=np.int8)
        tokens[:, : cfg.order] = rng.integers(0, cfg.vocab_size, (n_seq, cfg.order))
        cdf = np.cumsum(self.transition, axis=1)
        copy_left = np.zeros(n_seq, dtype=np.int64)
        lag = np.zeros(n_seq, dtype=np.int64)
        rows = np.arange(n_seq)
        for t in range(cfg.order, length):
            copying = copy_left > 0
            tokens[copying, t] = tokens[rows[copying], t - lag[copying]]
            modes[copying, t] = MODES["copy"]
            copy_left[copying] -= 1
            fresh = rows[~copying]
            modes[fresh, t] = MODES["fresh"]
            ctx = self.context_index(tokens[fresh, t - cfg.order : t])
            u = rng.random(len(fresh))[:, None]
            content = np.minimum((cdf[ctx] < u).sum(1), cfg.vocab_size - 1)  # inverse CDF
            tokens[fresh, t] = content
            k_t = self.markers_available(t)
            if k_t > 0:
                is_marker = rng.random(len(fresh)) < cfg.marker_prob
                marker = rng.integers(0, k_t, len(fresh))
                available = np.flatnonzero(self.lags <= t)
                starts = fresh[is_marker]
                tokens[starts, t] = cfg.vocab_size + available[marker[is_marker]]
                copy_left[starts] = cfg.copy_length
                lag[starts] = self.lags[available[marker[is_marker]]]
        return tokens, modes

    # --- reading a sequence: what the optimal predictor knows ----------------------

    def parse(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mode (N, L) of every position and, for copies, the lag (0 elsewhere), from tokens."""
        cfg = self.config
        n_seq, length = tokens.shape
        modes = np.full((n_seq, length), MODES["init"], dtype=np.int8)
        lags = np.zeros((n_seq, length), dtype=np.int64)
        copy_left = np.zeros(n_seq, dtype=np.int64)
        lag = np.zeros(n_seq, dtype=np.int64)
        for t in range(cfg.order, length):
            copying = copy_left > 0
            modes[:, t] = np.where(copying, MODES["copy"], MODES["fresh"])
            lags[copying, t] = lag[copying]
            copy_left[copying] -= 1
            starts = ~copying & (tokens[:, t] >= cfg.vocab_size)
            copy_left[starts] = cfg.copy_length
            lag[starts] = self.lags[tokens[starts, t] - cfg.vocab_size]
        return modes, lags

    def log_probs(self, tokens: np.ndarray) -> np.ndarray:
        """``log p(x_t | x_<t)`` (N, L) under the source (-inf for impossible tokens)."""
        cfg = self.config
        modes, lags = self.parse(tokens)
        n_seq, length = tokens.shape
        out = np.full((n_seq, length), -np.log(cfg.vocab_size))
        rows = np.arange(n_seq)
        with np.errstate(divide="ignore"):
            for t in range(cfg.order, length):
                x = tokens[:, t]
                copy = modes[:, t] == MODES["copy"]
                source = tokens[rows, np.maximum(t - lags[:, t], 0)]
                ctx = self.context_index(tokens[:, t - cfg.order : t])
                is_marker = x >= cfg.vocab_size
                k_t = self.markers_available(t)
                p = cfg.marker_prob if k_t > 0 else 0.0
                content = np.log((1 - p) * self.transition[ctx, np.minimum(x, cfg.vocab_size - 1)])
                marker_ok = is_marker & (self.lags[np.maximum(x - cfg.vocab_size, 0)] <= t)
                marker = np.where(marker_ok, np.log(p / max(k_t, 1)), -np.inf)
                fresh = np.where(is_marker, marker, content)
                out[:, t] = np.where(copy, np.where(x == source, 0.0, -np.inf), fresh)
        return out


# ----------------------------------------------------------------------------- the track


@dataclass
class LMTrack:
    """Token sequences (N, seq_len) int64 of each split, and the exact floors.

    ``floor_nats``: exact expected loss of the best predictor of positions 1..L-1;
    ``entropy_rate_nats``: the stationary rate; ``test_optimal_nats``: the best
    predictor's realised mean loss on this test split (a sample value).
    """

    config: LMConfig
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    entropy_rate_nats: float
    floor_nats: float
    test_optimal_nats: float

    @property
    def floor_perplexity(self) -> float:
        return float(np.exp(self.floor_nats))

    def split(self, name: str) -> np.ndarray:
        if name not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {name!r}")
        return getattr(self, name)


def build_arrays(config: LMConfig) -> dict[str, np.ndarray]:
    """Every split of ``config``, each from its own seed stream; and the floors."""
    source = MarkovCopySource(config)
    arrays: dict[str, np.ndarray] = {}
    for index, name in enumerate(SPLITS, start=1):
        rng = np.random.default_rng(np.random.SeedSequence([config.seed, index]))
        arrays[name] = source.sample(getattr(config, f"n_{name}"), config.seq_len, rng)[0]
    test_optimal = -source.log_probs(arrays["test"])[:, 1:].mean()
    arrays["floors"] = np.array([source.entropy_rate(), source.floor(config.seq_len), test_optimal])
    return arrays


def load_lm(
    config: LMConfig | None = None, data_dir: str | Path | None = None, use_cache: bool = True
) -> LMTrack:
    """The ``lm`` track: read from the cache, or generated (and cached atomically)."""
    config = LMConfig() if config is None else config
    config.validate()
    stored_config = {"config": np.array(json.dumps(asdict(config)))}  # readable without rpka
    arrays = cached_arrays(config, build_arrays, data_dir, use_cache, stored_config)
    rate, floor, test_optimal = (float(x) for x in arrays["floors"])
    return LMTrack(
        config, arrays["train"], arrays["val"], arrays["test"], rate, floor, test_optimal
    )


def ngram_baseline_nats(
    train: np.ndarray, test: np.ndarray, n_tokens: int, order: int = 1
) -> float:
    """Test loss (nats/token, positions >= order) of an add-one-smoothed n-gram model fit on
    train: a model without long context, which cannot copy. It bounds what attention adds."""
    if not 0 <= order <= 3:
        raise ValueError(f"order must lie in 0..3, got {order!r}")

    def contexts(seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        index = np.zeros((seqs.shape[0], seqs.shape[1] - order), dtype=np.int64)
        for lag in range(order, 0, -1):
            index = index * n_tokens + seqs[:, order - lag : seqs.shape[1] - lag]
        return index.ravel(), seqs[:, order:].ravel()

    ctx, nxt = contexts(train)
    counts = np.ones((n_tokens**order, n_tokens))
    np.add.at(counts, (ctx, nxt), 1.0)
    probs = counts / counts.sum(1, keepdims=True)
    ctx, nxt = contexts(test)
    return float(-np.log(probs[ctx, nxt]).mean())


# ----------------------------------------------------------------------------- the task

# learnability bar: exact attention must close at least this fraction of the gap between
# the best n-gram model and the exact floor (test NLL, nats)
LM_GAP_CLOSED_REQUIRED = 0.5
# n-gram baselines: context lengths (an order-k model conditions on k tokens)
NGRAM_ORDERS = (1, 2)
LM_NAMES = {
    "floor": "floor: exact entropy of the source",
    "source_optimal": "source-optimal predictor (realised)",
}



class LMTask(CausalTokenTask):
    """The causal decoder ``TransformerLM`` reads tokens 0..L-2 and predicts 1..L-1.

    Loss = cross-entropy (nats); metrics the mean negative log-likelihood per predicted
    token ``NLL = -(1/N) sum log p(x_t | x_<t)`` and the perplexity ``exp(NLL)``, per member
    over the whole split (so the perplexity of a split is that of its pooled tokens, not a
    mean of per-sequence perplexities); baselines the exact floor, the source-optimal
    predictor and n-gram models; learnability = exact attention closing at least half of
    the gap between the best n-gram model and the floor.
    """

    name = "lm"
    config_class = LMConfig
    metrics = ("perplexity", "nll")
    loss_label = "cross-entropy (nats/token)"
    out_dir = "lm"
    title = "Language-model track"

    def load(self, config: LMConfig, data_dir: str | Path | None = None) -> LMTrack:
        return load_lm(config, data_dir)

    def build_model(self, model, track: LMConfig, seeds, method, options) -> nn.Module:
        return TransformerLM(model, track.n_tokens, track.attention_tokens, seeds, method, options)

    def inputs_targets(self, track: LMTrack, split: str) -> tuple[Tensor, Tensor]:
        tokens = torch.from_numpy(track.split(split)).long()
        return tokens[:, :-1], tokens[:, 1:]  # inputs 0..L-2 predict 1..L-1

    @staticmethod
    def token_nll(logits: Tensor, y: Tensor) -> Tensor:
        """-log p(y) per token: logits (S, B, n, V), y (S or 1, B, n) -> (S, B, n)."""
        targets = y.expand(logits.shape[:-1])
        flat = F.cross_entropy(logits.flatten(0, 2), targets.flatten(), reduction="none")
        return flat.view(targets.shape)

    def loss(self, pred: Tensor, y: Tensor) -> Tensor:
        return self.token_nll(pred, y).mean((1, 2))  # cross-entropy per member (nats)

    def error_sums(self, pred: Tensor, y: Tensor) -> dict[str, Tensor]:
        return {"nll": self.token_nll(pred.double(), y.unsqueeze(0)).sum((1, 2))}

    def finish(self, sums: dict[str, Tensor], count: int) -> dict[str, Tensor]:
        nll = sums["nll"] / count
        return {"perplexity": nll.exp(), "nll": nll}

    def naive_baselines(self, track: LMTrack) -> dict[str, Any]:
        return lm_baselines(track)

    def naive_rows(self, report: Mapping, split: str) -> list[tuple[str, dict[str, float]]]:
        """The exact floor (a number of the source, the same on every split), the
        source-optimal predictor's realised loss and the n-gram models."""
        naive = report["naive_baselines"]
        rows = [(LM_NAMES["floor"], dict(naive["floor"]))]
        for key, predictor in naive["predictors"].items():
            if key.startswith("ngram_"):
                order = int(key.split("_")[1])
                label = f"n-gram, {order} token{'s' if order > 1 else ''} of context"
            else:
                label = LM_NAMES.get(key, key)
            rows.append((label, dict(predictor[split])))
        return rows

    def reference_lines(self, report: Mapping, split: str) -> list[tuple[str, float, str]]:
        """The exact floor and the bigram model."""
        metric, naive = report["metric"], report["naive_baselines"]
        return [
            ("exact floor", naive["floor"][metric], ":"),
            ("n-gram, 1 token", naive["predictors"]["ngram_1"][split][metric], "--"),
        ]

    def learnability(self, baseline: dict[str, Any], naive: dict[str, Any]) -> dict[str, Any]:
        return lm_learnability(baseline["full_by_metric"]["nll"]["mean"], naive)

    def learnability_text(self, report: Mapping) -> str:
        le = report["learnability"]
        met = self.bar_word(le)
        base = report["arms"][report["baseline_arm"]]["full"]
        mean = (
            f"; the mean of the seeds' perplexities, the metric compared above, is "
            f"{base['mean']:.3f}"
            if report["metric"] == "perplexity"
            else ""
        )
        return (
            f"Exact attention's test perplexity as exp(mean NLL over seeds) "
            f"{le['baseline_test_perplexity']:.3f} (mean NLL {le['baseline_test_nll']:.4f} "
            f"nats{mean}) against the best n-gram model "
            f"(`{le['best_ngram']}`) {le['best_ngram_perplexity']:.3f} "
            f"({le['best_ngram_nll']:.4f} nats) and the exact floor "
            f"{le['floor_perplexity']:.3f} ({le['floor_nll']:.4f} nats): it closes "
            f"{le['gap_closed']:.0%} of the gap between the n-gram model and the floor "
            f"(required ≥ {le['gap_closed_required']:.0%}): the learnability bar is {met}."
        )

    def data_summary(self, track: LMTrack) -> dict[str, Any]:
        config = track.config
        return {
            "n_train_sequences": len(track.train),
            "n_val_sequences": len(track.val),
            "n_test_sequences": len(track.test),
            "seq_len": config.seq_len,
            "attention_tokens": config.attention_tokens,
            "n_tokens": config.n_tokens,
            "copy_lags": list(config.lags),
            "tokens_per_split": {
                s: int(track.split(s).shape[0] * config.attention_tokens)
                for s in ("train", "val", "test")
            },
        }

    def arm_extras(self, entry: dict[str, Any], naive: dict[str, Any]) -> dict[str, Any]:
        return {"floor_gap": floor_gap(entry, naive)}

    def extra_columns(self, report: Mapping, values: Mapping[str, float]) -> dict[str, Any]:
        """The mean NLL (nats) and the gaps to the exact floor."""
        floor = report["naive_baselines"]["floor"]
        return {
            "NLL (nats)": values["nll"],
            "perplexity - floor": values["perplexity"] - floor["perplexity"],
            "NLL - floor (nats)": values["nll"] - floor["nll"],
        }

    def metric_label(self, metric: str) -> str:
        return "NLL (nats/token)" if metric == "nll" else metric

    def setup_text(self, report: Mapping, protocol: str) -> str:
        cfg, data = report["config"], report["data"]
        track, model, train = cfg["track"], cfg["model"], cfg["train"]
        return (
            f"**Track `lm`.** Token sequences from a seeded Markov source with copies: "
            f"{track['vocab_size']} content tokens from an order-{track['order']} Markov chain, "
            f"and copy markers (lags {data['copy_lags']}) after which the next "
            f"{track['copy_length']} tokens repeat the token that many positions back. Its "
            f"entropy is exact, so perplexity has a known floor. {data['n_train_sequences']} "
            f"training, {data['n_val_sequences']} validation and {data['n_test_sequences']} "
            f"test sequences of {data['seq_len']} tokens ({data['n_tokens']} token types).\n\n"
            f"**Model `{report['model']}` in causal mode.** A decoder of {model['n_layers']} "
            f"pre-norm causal layers, d_model {model['d_model']}, {model['n_heads']} heads, "
            f"learned positions, output head tied to the token embedding; it reads tokens "
            f"0..{data['seq_len'] - 2} and predicts 1..{data['seq_len'] - 1} (attention sees "
            f"{data['attention_tokens']} tokens). Cross-entropy, Adam, {train['epochs']} "
            f"epochs, batch {train['batch_size']}, {train['lr_schedule']} schedule.\n\n" + protocol
        )

    def result_notes(self, report: Mapping) -> str:
        """Track lm: every arm's test perplexity next to the exact floor, and the gaps."""
        floor = report["naive_baselines"]["floor"]
        rate = report["naive_baselines"]["entropy_rate"]
        parts = [
            f"`{arm}` {e['floor_gap']['perplexity_mean']:.3f} "
            f"(+{e['floor_gap']['perplexity_gap']:.3f}; NLL +{e['floor_gap']['nll_gap']:.4f} nats)"
            for arm, e in report["arms"].items()
        ]
        return (
            f"The source's exact perplexity floor for these sequences is {floor['perplexity']:.3f} "
            f"({floor['nll']:.4f} nats/token; stationary entropy rate {rate['nll']:.4f} nats, "
            f"perplexity {rate['perplexity']:.3f}). Mean of the seeds' test perplexities over "
            f"{report['n_seeds']} seeds (not exp of the mean NLL), with the gap to the floor: "
            + "; ".join(parts) + "."
        )

    def summary_targets(self, report: Mapping) -> list[tuple[str, str, bool | None]]:
        le = report["learnability"]
        return [
            (
                "lm learnable: exact closes ≥ 50 % of the n-gram-to-floor gap",
                f"{le['gap_closed']:.0%}",
                le["met"],
            )
        ]


def source_optimal_nats(track: LMTrack, split: str) -> float:
    """Realised mean loss of the Bayes-optimal predictor (the source itself) on a split."""
    return float(-MarkovCopySource(track.config).log_probs(track.split(split))[:, 1:].mean())


def _nats(value: float) -> dict[str, float]:
    return {"nll": value, "perplexity": math.exp(value)}


def lm_baselines(track: LMTrack, splits: tuple[str, ...] = ("val", "test")) -> dict[str, Any]:
    """The floor and the reference predictors of track ``lm``, in nats and perplexity.

    ``floor``: the exact expected loss of the best predictor of tokens 1..L-1 (the
    perplexity floor ``exp(floor)``); ``entropy_rate``: the stationary rate it tends to.
    ``predictors``: ``source_optimal`` (the source's own conditional probabilities on the
    split: the floor's realised value) and ``ngram_<k>`` (add-one-smoothed n-gram models
    with k tokens of context, fit on train; without long context they cannot copy). The
    n-gram losses average positions k..L-1; every other number positions 1..L-1.
    """
    n_tokens = track.config.n_tokens
    predictors: dict[str, dict[str, dict[str, float]]] = {
        "source_optimal": {s: _nats(source_optimal_nats(track, s)) for s in splits}
    }
    for order in NGRAM_ORDERS:
        predictors[f"ngram_{order}"] = {
            s: _nats(ngram_baseline_nats(track.train, track.split(s), n_tokens, order))
            for s in splits
        }
    return {
        "floor": _nats(track.floor_nats),
        "entropy_rate": _nats(track.entropy_rate_nats),
        "ngram_orders": list(NGRAM_ORDERS),
        "predictors": predictors,
    }


def lm_learnability(baseline_nll: float, naive: dict[str, Any]) -> dict[str, Any]:
    """Exact attention against the best n-gram model and the floor (test NLL, nats).

    ``gap_closed = (ngram - baseline) / (ngram - floor)``: 0 = no better than an n-gram
    model, 1 = at the floor. The bar: at least ``LM_GAP_CLOSED_REQUIRED``.
    """
    ngrams = {k: v["test"]["nll"] for k, v in naive["predictors"].items() if k.startswith("ngram")}
    best = min(ngrams, key=ngrams.get)
    ngram, floor = ngrams[best], naive["floor"]["nll"]
    gap_closed = (ngram - baseline_nll) / (ngram - floor)
    return {
        "baseline_test_nll": baseline_nll,
        "baseline_test_perplexity": math.exp(baseline_nll),
        "best_ngram": best,
        "best_ngram_nll": ngram,
        "best_ngram_perplexity": math.exp(ngram),
        "floor_nll": floor,
        "floor_perplexity": math.exp(floor),
        "gap_closed": gap_closed,
        "gap_closed_required": LM_GAP_CLOSED_REQUIRED,
        "met": bool(gap_closed >= LM_GAP_CLOSED_REQUIRED),
    }


def floor_gap(entry: dict[str, Any], naive: dict[str, Any]) -> dict[str, Any]:
    """An arm's test perplexity and NLL next to the floor: the gaps (arm - floor)."""
    floor = naive["floor"]
    ppl = entry["full_by_metric"]["perplexity"]
    nll = entry["full_by_metric"]["nll"]
    per_seed = [
        None if v is None or not np.isfinite(v) else v - floor["nll"] for v in nll["per_seed"]
    ]
    return {
        "floor_perplexity": floor["perplexity"],
        "floor_nll": floor["nll"],
        "perplexity_mean": ppl["mean"],
        "perplexity_gap": ppl["mean"] - floor["perplexity"],
        "perplexity_ratio": ppl["mean"] / floor["perplexity"],
        "nll_mean": nll["mean"],
        "nll_gap": nll["mean"] - floor["nll"],
        "nll_gap_per_seed": per_seed,
    }
