"""Track ``recall``: multi-query associative recall (MQAR; Arora et al. 2023, *Zoology*).

DESIGN.md section 4, issue 14. A sequence first lists ``n_pairs`` key-value pairs, then, in
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

Splits ``train`` / ``val`` / ``test`` at ``seq_len``, and ``test_x<f>`` for each factor f
in ``length_factors`` (sequences f times longer, the same pairs and queries: length
generalisation), each from an independent seed stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rpka.tracks.cache import cached_arrays
from rpka.tracks.forecast import SPLITS
from rpka.tracks.windows import is_int, require, require_int

FILLER = 0
IGNORE = -1


@dataclass(frozen=True)
class RecallConfig:
    """``recall`` (see the module docstring)."""

    name: str = "recall"
    vocab_size: int = 64
    n_pairs: int = 8
    n_queries: int = 8
    seq_len: int = 64
    length_factors: tuple[int, ...] = (2, 4)
    n_train: int = 20_000
    n_val: int = 1_000
    n_test: int = 1_000
    seed: int = 0

    @property
    def n_keys(self) -> int:
        return (self.vocab_size - 1) // 2

    @property
    def max_len(self) -> int:
        """The longest sequence of any split (the model's positions must cover it)."""
        return self.seq_len * max((1, *self.length_factors))

    @property
    def split_names(self) -> tuple[str, ...]:
        return (*SPLITS, *(f"test_x{f}" for f in self.length_factors))

    def validate(self) -> None:
        require(self.name == "recall", "name", "'recall'", self.name)
        require_int(self, "vocab_size", 5)
        require_int(self, "n_pairs", 1, self.n_keys)
        require_int(self, "n_queries", 1)
        require_int(self, "seq_len", 2 * (self.n_pairs + self.n_queries))
        factors = self.length_factors
        require(
            isinstance(factors, tuple) and all(is_int(f) and f >= 2 for f in factors),
            "recall.length_factors",
            "a tuple of integers >= 2",
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
        return getattr(self, f"n_{split}") if split in SPLITS else self.n_test


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
        factor = int(split.removeprefix("test_x")) if split.startswith("test_x") else 1
        drawn = sample(
            config, config.split_size(split), config.seq_len * factor, config.split_rng(split)
        )
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


def load_recall(
    config: RecallConfig | None = None, data_dir: str | Path | None = None, use_cache: bool = True
) -> RecallTrack:
    """The ``recall`` track: read from the cache, or generated (and cached)."""
    config = RecallConfig() if config is None else config
    config.validate()
    return RecallTrack(config, cached_arrays(config, build_arrays, data_dir, use_cache))


def recall_baselines(config: RecallConfig) -> dict[str, float]:
    """Accuracies that need no recall: ``chance`` (uniform over the value tokens) and
    ``in_context`` (uniform over the sequence's own values, which a model can find without
    matching keys: 1 / n_pairs when values rarely repeat)."""
    n_values = config.vocab_size - 1 - config.n_keys
    return {"chance": 1.0 / n_values, "in_context": 1.0 / config.n_pairs}
