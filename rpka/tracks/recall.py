"""Track ``recall``: multi-query associative recall (MQAR; Arora et al. 2023, *Zoology*).

Issue 14 (docs/design.md). A sequence first lists ``n_pairs`` key-value pairs, then, in
the rest of the sequence, asks ``n_queries`` of those keys again; the next token after a
queried key must be its value:

    k1 v1 k2 v2 ... kP vP | _ _ k7 v7 _ _ _ _ k2 v2 _ _ ...      (_ = the filler token 0)
                              ^ target v7     ^ target v2

Tokens: 0 is the filler; keys are ``1 .. n_keys`` and values ``n_keys + 1 .. vocab_size - 1``
with ``n_keys = (vocab_size - 1) // 2``. Per sequence the keys are drawn without
replacement, the values with replacement, the queried keys *with* replacement among the
pairs (asked without replacement, the values not yet asked would narrow down as queries go
by - a model counting which values occurred twice reached 37 % accuracy with uniform
attention at 8 pairs - so each query is independent of the earlier ones), and the queries
sit in random two-token slots after the pairs (uniform positions; Zoology draws query gaps
from a power law - uniform slots keep every distance equally likely). A causal model
reads ``tokens`` (N, n); ``targets`` (N, n) holds the value at a query key's position
and -1 (ignored) everywhere else, so loss and accuracy are taken at the query positions
only.

Solving it needs content-based lookup (find the earlier copy of the key, read the token
after it): a 2-layer attention model does it (an induction head), softmax attention
reaches ~100 % while a low-rank or recurrent state loses accuracy once the pairs outgrow
it - for RPKA, accuracy against rank / pairs is the direct test of the low-rank idea.

Splits ``train`` / ``val`` / ``test`` at ``seq_len``, and ``test_x<f>`` / ``val_x<f>`` for
each factor f in ``length_factors`` (sequences f times longer, the same pairs and queries:
length generalisation), each from an independent seed stream.

**Length generalisation in the bench.** The bench scores one ``val`` and one ``test``
tensor per run, so the task's ``val`` / ``test`` inputs stack the sequences of every length
(each padded with filler to ``max_len``; a causal model's outputs at a position do not
depend on the padding after it) and the targets carry each sequence's length factor in
an extra last column: the metrics ``error`` / ``nll`` (training length) and ``error_x2`` /
``error_x4`` (2x and 4x) come from one pass, and every run's scores - the bench report's
``full_by_metric`` per arm - hold the accuracy at each length. The learned positions
cover ``max_len`` = 4 x ``seq_len`` (``TransformerLM``'s ``max_len``); positions past
``seq_len`` are never trained, which is part of what the length test measures.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rpka.checks import require
from rpka.model import TransformerLM
from rpka.tracks.base import CausalTokenTask
from rpka.tracks.common import SPLITS, require_int, track_loader
from rpka.tracks.recall_text import RecallText

FILLER = 0
IGNORE = -1
# the longer evaluation lengths, as multiples of seq_len: fixed because the task's metric
# names (error_x2, error_x4) are fixed for every bench of the track
LENGTH_FACTORS = (2, 4)


@dataclass(frozen=True)
class RecallConfig:
    """``recall`` (see the module docstring)."""

    name: str = "recall"
    vocab_size: int = 64
    n_pairs: int = 8
    n_queries: int = 8
    seq_len: int = 64
    length_factors: tuple[int, ...] = LENGTH_FACTORS
    n_train: int = 20_000
    n_val: int = 1_000
    n_test: int = 1_000
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.length_factors, list):  # e.g. from JSON: store the hashable form
            object.__setattr__(self, "length_factors", tuple(self.length_factors))

    @property
    def attention_tokens(self) -> int:
        """Tokens one attention call sees in training."""
        return self.seq_len

    @property
    def n_keys(self) -> int:
        return (self.vocab_size - 1) // 2

    @property
    def max_len(self) -> int:
        """The longest sequence of any split (the model's positions must cover it)."""
        return self.seq_len * max((1, *self.length_factors))

    @property
    def split_names(self) -> tuple[str, ...]:
        # val_x<f> last: the streams of the earlier splits do not move
        lengths = [f"{base}_x{f}" for base in ("test", "val") for f in self.length_factors]
        return (*SPLITS, *lengths)

    def validate(self) -> None:
        require(self.name == "recall", "name", "'recall'", self.name)
        require_int(self, "vocab_size", 5)
        require_int(self, "n_pairs", 1, self.n_keys)
        require_int(self, "n_queries", 1)
        require_int(self, "seq_len", 2 * (self.n_pairs + self.n_queries))
        factors = self.length_factors
        require(
            factors == LENGTH_FACTORS,
            "recall.length_factors",
            f"the tuple {LENGTH_FACTORS} (the metrics error_x2, error_x4)",
            factors,
        )
        for split in SPLITS:
            require_int(self, f"n_{split}", 1)
        require_int(self, "seed", 0)

    def split_rng(self, split: str) -> np.random.Generator:
        """An independent stream per split (the length tests after the three splits)."""
        index = self.split_names.index(split)
        return np.random.default_rng(np.random.SeedSequence([self.seed, 1 + index]))

    def split_size(self, split: str) -> int:
        return getattr(self, f"n_{split.split('_x')[0]}")


def length_factor(split: str) -> int:
    """The length of a split's sequences in units of ``seq_len``: "test_x4" -> 4, "val" -> 1."""
    return int(split.split("_x")[1]) if "_x" in split else 1


def sample(
    config: RecallConfig, n: int, seq_len: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """n sequences of ``seq_len`` tokens: ``tokens`` (N, n) int64 and ``targets`` (N, n) int64
    (the value at query keys, -1 elsewhere); see the module docstring."""
    p, q = config.n_pairs, config.n_queries
    # keys without replacement: the first p of a random permutation of 1..n_keys
    keys = 1 + np.argsort(rng.random((n, config.n_keys)), axis=1)[:, :p]
    values = rng.integers(config.n_keys + 1, config.vocab_size, (n, p))
    tokens = np.full((n, seq_len), FILLER, dtype=np.int64)
    targets = np.full((n, seq_len), IGNORE, dtype=np.int64)
    tokens[:, 0 : 2 * p : 2], tokens[:, 1 : 2 * p : 2] = keys, values
    # which pairs are asked (with replacement: no elimination) and in which two-token slots
    asked = rng.integers(0, p, (n, q))
    n_slots = (seq_len - 2 * p) // 2
    slots = np.sort(np.argsort(rng.random((n, n_slots)), axis=1)[:, :q], axis=1)
    at = 2 * p + 2 * slots  # (N, q) query key positions
    rows = np.arange(n)[:, None]
    query_keys = np.take_along_axis(keys, asked, 1)
    query_values = np.take_along_axis(values, asked, 1)
    tokens[rows, at], tokens[rows, at + 1] = query_keys, query_values
    targets[rows, at] = query_values
    return {"tokens": tokens, "targets": targets}


def build_arrays(config: RecallConfig) -> dict[str, np.ndarray]:
    """``<split>_tokens`` and ``<split>_targets`` for every split in ``config.split_names``."""
    config.validate()
    arrays: dict[str, np.ndarray] = {}
    for split in config.split_names:
        n, length = config.split_size(split), config.seq_len * length_factor(split)
        drawn = sample(config, n, length, config.split_rng(split))
        for key, value in drawn.items():
            arrays[f"{split}_{key}"] = value
    return arrays


@dataclass
class RecallTrack:
    """Per split, ``tokens`` and ``targets`` (N, n) int64 (see :func:`sample`)."""

    config: RecallConfig
    arrays: dict[str, np.ndarray]

    def split(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        if name not in self.config.split_names:
            raise ValueError(f"split must be one of {self.config.split_names}, got {name!r}")
        return self.arrays[f"{name}_tokens"], self.arrays[f"{name}_targets"]

    def scored(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """The model inputs (N', n') and targets (N', n' + 1) of ``train``, ``val`` or ``test``
        (module docstring): ``train`` as drawn (n' = seq_len); ``val`` / ``test`` with the
        sequences of every length factor stacked, padded to ``max_len`` (filler tokens,
        ignored targets). The targets' last column is each sequence's length factor."""
        if name not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {name!r}")
        config = self.config
        longer = [] if name == "train" else [f"{name}_x{f}" for f in config.length_factors]
        width = config.seq_len if name == "train" else config.max_len
        tokens, targets = [], []
        for part in (name, *longer):
            x, y = self.split(part)
            pad = ((0, 0), (0, width - x.shape[1]))
            tokens.append(np.pad(x, pad, constant_values=FILLER))
            factor = np.full((len(y), 1), length_factor(part), dtype=y.dtype)
            targets.append(np.concatenate([np.pad(y, pad, constant_values=IGNORE), factor], 1))
        return np.concatenate(tokens), np.concatenate(targets)


def has_every_split(config: RecallConfig, arrays: dict[str, np.ndarray]) -> bool:
    """Whether cached arrays hold every split (a cache written before the ``val_x<f>``
    splits existed does not: it is rebuilt, the same config)."""
    return all(f"{split}_tokens" in arrays for split in config.split_names)


load_recall = track_loader(RecallConfig, build_arrays, RecallTrack, complete=has_every_split)


def recall_baselines(config: RecallConfig) -> dict[str, float]:
    """Accuracies that need no recall: ``chance`` (uniform over the value tokens) and
    ``in_context`` (uniform over the sequence's own values, which a model can find without
    matching keys: 1 / n_pairs when values rarely repeat)."""
    n_values = config.vocab_size - 1 - config.n_keys
    return {"chance": 1.0 / n_values, "in_context": 1.0 / config.n_pairs}


# ----------------------------------------------------------------------------- the task

# learnability bar (issue 14): exact attention's query accuracy at the training length
RECALL_ACCURACY = 0.95


# the metrics: query error and NLL at the training length, then the error at each longer one
LENGTH_METRICS = tuple(f"error_x{f}" for f in LENGTH_FACTORS)


def query_nll(logits: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """-log p(target) and the query mask, both (S, B, n): logits (S, B, n, V), y (S|1, B,
    n + 1) - the targets, ``IGNORE`` away from the queries, then the length factor."""
    targets = y[..., :-1].expand(logits.shape[:-1])
    mask = targets != IGNORE
    flat = F.cross_entropy(logits.flatten(0, 2), targets.clamp(min=0).flatten(), reduction="none")
    return flat.view(targets.shape) * mask, mask


class RecallTask(CausalTokenTask):
    """The causal decoder ``TransformerLM`` reads a sequence and, at each query key, predicts
    its value. Loss = cross-entropy at the query positions only; metrics ``error`` (1 -
    query accuracy, so that lower is better like every metric) and ``nll`` (nats per
    query); baselines chance and a guess among the sequence's own values; learnability =
    exact attention's accuracy >= 95 %. ``error_x2`` / ``error_x4``: the query error on
    sequences 2x and 4x the training length (module docstring)."""

    name = "recall"
    config_class = RecallConfig
    metrics = ("error", "nll", *LENGTH_METRICS)
    out_dir = "recall"
    text = RecallText(
        title="Associative-recall track (MQAR)",
        loss_label="cross-entropy at queries (nats)",
        accuracy_required=RECALL_ACCURACY,
        length_metrics=LENGTH_METRICS,
    )

    def load(self, config: RecallConfig, data_dir: str | Path | None = None) -> RecallTrack:
        return load_recall(config, data_dir)

    def build_model(self, model, track: RecallConfig, seeds, method, options) -> nn.Module:
        return TransformerLM(model, track.vocab_size, track.max_len, seeds, method, options)

    def inputs_targets(self, track: RecallTrack, split: str) -> tuple[Tensor, Tensor]:
        """Tokens (N, n) and targets (N, n + 1), see :meth:`RecallTrack.scored`."""
        tokens, targets = track.scored(split)
        return torch.from_numpy(tokens).long(), torch.from_numpy(targets).long()

    def loss(self, pred: Tensor, y: Tensor) -> Tensor:
        nll, mask = query_nll(pred, y)
        return nll.sum((1, 2)) / mask.sum((1, 2))

    def error_sums(self, pred: Tensor, y: Tensor) -> dict[str, Tensor]:
        """Per length factor f (suffix "" for 1, "_x<f>" else): wrong answers, NLL and the
        number of queries, summed over the batch's sequences of that length."""
        nll, mask = query_nll(pred.double(), y.unsqueeze(0))
        wrong = ((pred.argmax(-1) != y[:, :-1].unsqueeze(0)) & mask).double()
        factor = y[:, -1]
        sums = {}
        for f in (1, *LENGTH_FACTORS):
            rows = factor == f
            suffix = "" if f == 1 else f"_x{f}"
            sums[f"wrong{suffix}"] = wrong[:, rows].sum((1, 2))
            sums[f"nll{suffix}"] = nll[:, rows].sum((1, 2))
            sums[f"queries{suffix}"] = mask[:, rows].sum((1, 2)).double()
        return sums

    def count(self, y: Tensor) -> int:
        return int((y[:, :-1] != IGNORE).sum())

    def finish(self, sums: dict[str, Tensor], count: int) -> dict[str, Tensor]:
        """Each length's sums over its own number of queries (``count`` spans them all)."""
        out = {"error": sums["wrong"] / sums["queries"], "nll": sums["nll"] / sums["queries"]}
        for metric in LENGTH_METRICS:
            suffix = metric.removeprefix("error")
            out[metric] = sums[f"wrong{suffix}"] / sums[f"queries{suffix}"]
        return out

    def naive_baselines(self, track: RecallTrack) -> dict[str, Any]:
        """Predictors that need no recall, as errors and NLLs (the same on every split and
        at every length: neither reads the positions)."""
        rows = {}
        for key, accuracy in recall_baselines(track.config).items():
            values = {"error": 1 - accuracy, "nll": float(-np.log(accuracy))}
            values |= {metric: 1 - accuracy for metric in LENGTH_METRICS}
            rows[key] = {split: dict(values) for split in SPLITS}
        return {"predictors": rows}

    def learnability(self, baseline: dict[str, Any], naive: dict[str, Any]) -> dict[str, Any]:
        accuracy = 1 - baseline["full_by_metric"]["error"]["mean"]
        return {
            "baseline_test_accuracy": accuracy,
            "accuracy_required": RECALL_ACCURACY,
            "in_context_accuracy": 1 - naive["predictors"]["in_context"]["test"]["error"],
            "met": bool(accuracy >= RECALL_ACCURACY),
        }

    def data_summary(self, track: RecallTrack) -> dict[str, Any]:
        config = track.config
        return {
            "n_train_sequences": config.n_train,
            "n_val_sequences": config.n_val,
            "max_len": config.max_len,
            "n_test_sequences": config.n_test,
            "seq_len": config.seq_len,
            "attention_tokens": config.attention_tokens,
            "vocab_size": config.vocab_size,
            "n_pairs": config.n_pairs,
            "n_queries": config.n_queries,
            "length_factors": list(config.length_factors),
        }
