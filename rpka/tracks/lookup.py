"""Track ``forecast-lookup``: the answer lies far back (issue 27).

A multi-query associative recall (MQAR) in a series. Every window of ``context`` steps is
background noise N(0, 1) holding ``n_pairs`` key-value pairs: a *cue* (``cue_length``
steps of a +-1 pattern times ``cue_scale``) followed at once by a *payload* (``horizon``
steps of N(0, 1), fresh in every window). The cues are ``n_pairs`` distinct entries of a
codebook of ``n_cues`` fixed patterns (drawn once from ``seed``, shared by every window and
split: the keys a model can learn), so a window's pairs differ in cue, position and
payload. The context ends with one of the cues again, chosen uniformly (the query); the
target - the ``horizon`` steps after the context - is that pair's payload:

    window = [ noise .. cue_a payload_a .. noise .. cue_b payload_b .. noise | cue_b ] -> payload_b
             '------------- pairs uniform over [0, context - min_distance) ------'

Pairs are placed uniformly (non-overlapping) over the context except its last
``min_distance`` steps, so the evidence lies anywhere from ``min_distance`` steps back to
the context's start and nothing in the last ``min_distance`` steps tells the answer (only
which pair is asked). ``min_distance`` is the local window plus the input embedding's reach
on both sides (128 + 2 x 8 = 144 in the presets): a sliding window of 128 tokens over
tokens that each see 8 steps either side cannot reach a payload step. Observation noise
N(0, ``noise``^2) on every step (the target too). Windows are standardised by their context
(``rpka.tracks.windows``).

How far back the evidence lies: :func:`locality` simulates the layout and returns the
distance from the context's last step back to the queried payload's last step (its
nearest step): median, 10th / 90th percentiles, and the share within a window of w steps
(0 by construction for w <= ``min_distance``). With ``n_copies`` > 1 each pair
occurs that many times (all far back: "rarely") and the distance is to its nearest
occurrence.

The background (issue 41): ``background="noise"`` is the N(0, 1) above; ``"patterns"`` is
a low-diversity background of ``n_patterns`` fixed patterns of ``pattern_length`` steps
(N(0, 1), drawn once from ``seed`` like the cues), tiled in random order - many
near-duplicate points, the case where landmarks drawn uniformly spend their rank on
repeats and residual pivoting should not. The pairs, the query and the observation noise
are as with noise. Per window ``cue_start`` and ``pair_of`` (N, n_pairs x n_copies),
``cue`` (N, n_pairs), ``query`` (N,), ``payload_start`` and ``distance`` (N,) are stored
for the tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rpka.checks import is_int, is_number, require
from rpka.tracks.common import SPLITS, require_int
from rpka.tracks.text import WindowText
from rpka.tracks.windows import WindowForecastTask, generated_arrays, window_loader

# learnability bar: exact attention's test MSE at most this times the linear forecast's (as
# forecast-regimes; the linear forecast cannot route a payload from a varying position)
LOOKUP_LINEAR_RATIO = 0.5
LOCALITY_QUANTILES = (0.1, 0.5, 0.9)  # locality(): 10th percentile, median, 90th
BACKGROUNDS = ("noise", "patterns")  # the background between the pairs (module docstring)


@dataclass(frozen=True)
class LookupConfig:
    """``forecast-lookup`` (see the module docstring); lengths in steps."""

    name: str = "forecast-lookup"
    context: int = 512
    horizon: int = 8  # also the payload's length
    cue_length: int = 8
    n_pairs: int = 2
    n_cues: int = 2  # the codebook's fixed cue patterns (>= n_pairs)
    n_copies: int = 1  # each pair occurs this many times (rarely, all far back)
    cue_scale: float = 2.0  # a cue's steps are +-cue_scale (the background's sd is 1)
    min_distance: int = 144  # no pair in the context's last min_distance steps
    noise: float = 0.1
    n_train: int = 4_000
    n_val: int = 256
    n_test: int = 256
    seed: int = 0
    background: str = "noise"  # one of BACKGROUNDS
    n_patterns: int = 4  # "patterns": the background's distinct patterns
    pattern_length: int = 16  # "patterns": steps of one pattern
    # knobs added after studies were committed: left out of run ids and cache names at their
    # defaults (rpka.tracks.cache.track_fields), so those studies keep theirs
    later_fields: ClassVar[tuple[str, ...]] = ("background", "n_patterns", "pattern_length")

    @property
    def pair_length(self) -> int:
        """Steps of one pair: its cue, then its payload."""
        return self.cue_length + self.horizon

    @property
    def n_slots(self) -> int:
        """Pair occurrences per window: ``n_pairs`` x ``n_copies``."""
        return self.n_pairs * self.n_copies

    @property
    def season_period(self) -> int:
        """No season: seasonal naive repeats the last ``horizon`` steps."""
        return self.horizon

    @property
    def attention_tokens(self) -> int:
        """Tokens one attention call sees: one per context step."""
        return self.context

    def validate(self) -> None:
        require(self.name == "forecast-lookup", "name", "'forecast-lookup'", self.name)
        require_int(self, "horizon", 1)
        require_int(self, "cue_length", 1)
        require_int(self, "n_pairs", 1)
        require_int(self, "n_cues", self.n_pairs)
        require_int(self, "n_copies", 1)
        require_int(self, "min_distance", self.cue_length)  # the query cue fits in the tail
        # the pairs' copies fit, non-overlapping, before the tail
        require_int(self, "context", self.min_distance + self.n_slots * self.pair_length)
        for field in ("cue_scale", "noise"):
            value = getattr(self, field)
            low_ok = value > 0 if field == "cue_scale" else value >= 0
            bound = "> 0" if field == "cue_scale" else ">= 0"
            require(is_number(value) and low_ok, f"{self.name}.{field}", bound, value)
        require(
            self.background in BACKGROUNDS, f"{self.name}.background", f"one of {BACKGROUNDS}",
            self.background,
        )  # fmt: skip
        require_int(self, "n_patterns", 1)
        require_int(self, "pattern_length", 1)
        for split in SPLITS:
            require_int(self, f"n_{split}", 1)
        require_int(self, "seed", 0)


def layout(config: LookupConfig, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Where the pairs lie: per occurrence (slot) ``cue_start`` (N, n_slots), increasing,
    non-overlapping, uniform over [0, context - min_distance - pair_length], and the pair it
    shows ``pair_of`` (N, n_slots; each pair ``n_copies`` times, in random order); the asked
    pair ``query`` (N,); its nearest occurrence's ``payload_start`` and ``distance`` (N,):
    the context's last step minus that payload's last step."""
    k, span = config.n_slots, config.pair_length
    room = config.context - config.min_distance - k * span  # free steps to share out
    # k sorted uniform draws in [0, room], then slot i shifted by the i slots before it
    offsets = np.sort(rng.integers(0, room + 1, (n, k)), axis=1)
    cue_start = offsets + span * np.arange(k)
    pairs = np.repeat(np.arange(config.n_pairs), config.n_copies)
    pair_of = pairs[np.argsort(rng.random((n, k)), axis=1)]
    query = rng.integers(0, config.n_pairs, n)
    # the asked pair's last occurrence (slots are in increasing order of position)
    nearest = np.where(pair_of == query[:, None], np.arange(k), -1).max(1)
    payload_start = cue_start[np.arange(n), nearest] + config.cue_length
    distance = (config.context - 1) - (payload_start + config.horizon - 1)
    return {
        "cue_start": cue_start,
        "pair_of": pair_of,
        "query": query,
        "payload_start": payload_start,
        "distance": distance,
    }


def codebook(config: LookupConfig) -> np.ndarray:
    """The fixed cue patterns (n_cues, cue_length): +-``cue_scale``, from ``config.seed``'s
    own stream (apart from the splits'), shared by every window."""
    rng = np.random.default_rng(np.random.SeedSequence([config.seed, 0]))
    return config.cue_scale * rng.choice((-1.0, 1.0), (config.n_cues, config.cue_length))


def background_patterns(config: LookupConfig) -> np.ndarray:
    """The low-diversity background's fixed patterns (n_patterns, pattern_length): N(0, 1)
    from ``config.seed``'s own stream (apart from the cues' and the splits'), shared by every
    window."""
    rng = np.random.default_rng(np.random.SeedSequence([config.seed, 1]))
    return rng.standard_normal((config.n_patterns, config.pattern_length))


def background(config: LookupConfig, n: int, rng: np.random.Generator) -> np.ndarray:
    """n windows' background (N, context + horizon): N(0, 1) noise, or ``"patterns"``: the
    fixed patterns tiled in an order drawn per tile."""
    total = config.context + config.horizon
    if config.background == "noise":
        return rng.standard_normal((n, total))
    tiles = -(-total // config.pattern_length)  # ceil
    order = rng.integers(0, config.n_patterns, (n, tiles))
    return background_patterns(config)[order].reshape(n, -1)[:, :total].copy()


def generate(config: LookupConfig, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """n raw windows ``raw`` (N, context + horizon), their layout (:func:`layout`) and the
    codebook entry of each pair ``cue`` (N, n_pairs)."""
    where = layout(config, n, rng)
    raw = background(config, n, rng)
    # n_pairs distinct codebook entries per window: the first n_pairs of a random order
    cue = np.argsort(rng.random((n, config.n_cues)), axis=1)[:, : config.n_pairs]
    cues = codebook(config)[cue]  # (N, n_pairs, cue_length)
    payloads = rng.standard_normal((n, config.n_pairs, config.horizon))
    rows = np.arange(n)[:, None]
    asked = np.arange(n)
    for i in range(config.n_slots):
        start, pair = where["cue_start"][:, i : i + 1], where["pair_of"][:, i]
        raw[rows, start + np.arange(config.cue_length)] = cues[asked, pair]
        raw[rows, start + config.cue_length + np.arange(config.horizon)] = payloads[asked, pair]
    raw[:, config.context - config.cue_length : config.context] = cues[asked, where["query"]]
    raw[:, config.context :] = payloads[asked, where["query"]]
    raw += config.noise * rng.standard_normal(raw.shape)
    return {"raw": raw, **where, "cue": cue}


def locality(
    config: LookupConfig, window: int, n_windows: int = 10_000, seed: int = 0
) -> dict[str, Any]:
    """How far back the evidence lies, by simulating ``n_windows`` layouts (seed ``seed``):
    the distance (steps) from the context's last step back to the queried payload's last
    step - ``median``, ``p10``, ``p90``, ``mean``, ``min``, ``max`` - and
    ``share_within_window``, the fraction of windows with distance < ``window`` (evidence a
    causal local window of ``window`` steps ending at the last token could see)."""
    config.validate()
    require(is_int(window) and window >= 1, "window", "an integer >= 1", window)
    require(is_int(n_windows) and n_windows >= 1, "n_windows", "an integer >= 1", n_windows)
    distance = layout(config, n_windows, np.random.default_rng(seed))["distance"]
    p10, median, p90 = np.quantile(distance, LOCALITY_QUANTILES)
    return {
        "context": config.context,
        "window": window,
        "n_windows": n_windows,
        "median": float(median),
        "p10": float(p10),
        "p90": float(p90),
        "mean": float(distance.mean()),
        "min": int(distance.min()),
        "max": int(distance.max()),
        "share_within_window": float(np.mean(distance < window)),
        "definition": "steps from the context's last step back to the last step of the "
        "queried pair's payload (its nearest evidence)",
    }


def build_arrays(config: LookupConfig) -> dict[str, np.ndarray]:
    """``<split>_{x, y, mean, std}`` and ``<split>_{cue_start, pair_of, query, payload_start,
    distance, cue}``."""
    return generated_arrays(config, generate)


load_lookup = window_loader(LookupConfig, build_arrays)


class LookupTask(WindowForecastTask):
    """``forecast-lookup``: the forecast model, loss and naive forecasts on this generator's
    windows; learnable when exact attention's test MSE is at most 0.5 x the linear
    forecast's."""

    name = "forecast-lookup"
    config_class = LookupConfig
    build_arrays = staticmethod(build_arrays)
    out_dir = "forecast-lookup"
    linear_ratio = LOOKUP_LINEAR_RATIO
    text = WindowText(
        title="Far lookup forecast track",
        description=(
            "Every window is noise holding a few cue-payload pairs placed anywhere but in the "
            "context's last steps; the context ends with one of the cues again, and the target "
            "is that cue's payload (an associative recall whose answer lies far back)."
        ),
        linear_ratio=LOOKUP_LINEAR_RATIO,
    )
