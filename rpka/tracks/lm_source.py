"""Track ``lm``'s config and its source: text from a seeded Markov source with copies, whose
entropy is known exactly (docs/design.md, "Tracks"; issue 7). The track and its
:class:`~rpka.tracks.lm.LMTask` are in ``rpka.tracks.lm``.

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

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import scipy.linalg

from rpka.checks import is_int, is_number, require


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
            require(is_int(value) and value >= low, f"track.{name}", f"an integer >= {low}", value)

        require(self.name == "lm", "track.name", "'lm'", self.name)
        at_least("vocab_size", 2)
        at_least("copy_length", 1)
        at_least("seq_len", 2)
        for name in ("n_train", "n_val", "n_test"):
            at_least(name, 1)
        at_least("seed", 0)
        require(is_int(self.order) and 1 <= self.order <= 3, "track.order", "1, 2 or 3", self.order)
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
