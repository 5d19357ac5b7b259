"""Track ``lm``: token sequences from the Markov source with copies of
``rpka.tracks.lm_source`` (its config and exact entropy), split, cached, and its
:class:`LMTask`: a causal decoder scored by perplexity against the exact floor and n-gram
models (docs/design.md, "Tracks"; issue 7). Its words are ``rpka.tracks.lm_text``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rpka.model import TransformerLM
from rpka.tracks.base import CausalTokenTask
from rpka.tracks.common import SPLITS, track_loader
from rpka.tracks.lm_source import LMConfig, MarkovCopySource
from rpka.tracks.lm_text import LMText

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


def stored_config(config: LMConfig) -> dict[str, np.ndarray]:
    """The config as JSON, saved beside the arrays: a cache file readable without rpka."""
    return {"config": np.array(json.dumps(asdict(config)))}


def lm_track(config: LMConfig, arrays: dict[str, np.ndarray]) -> LMTrack:
    """The :class:`LMTrack` of a config's cached arrays."""
    rate, floor, test_optimal = (float(x) for x in arrays["floors"])
    return LMTrack(
        config, arrays["train"], arrays["val"], arrays["test"], rate, floor, test_optimal
    )


load_lm = track_loader(LMConfig, build_arrays, lm_track, stored=stored_config)


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
    out_dir = "lm"
    text = LMText(title="Language-model track", loss_label="cross-entropy (nats/token)")

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

    def learnability(self, baseline: dict[str, Any], naive: dict[str, Any]) -> dict[str, Any]:
        return lm_learnability(baseline["full_by_metric"]["nll"]["mean"], naive)

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
