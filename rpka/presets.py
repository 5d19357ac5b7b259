"""The one source of truth for the benchmark's configuration.

Frozen dataclasses describe a study, from the data to the arms compared:

* :class:`TrackConfig` - which data, how long, how it is windowed and split (forecast);
* :class:`LMConfig` - the Markov-copy token source and its splits (track ``lm``);
* :class:`ModelConfig` - the ``transformer_tiny`` model's shape (encoder or causal decoder);
* :class:`TrainConfig` - epochs, batch size, optimiser;
* :class:`ArmConfig` - one attention method with its options ("exact", "rpka-r16", ...);
* :class:`BenchConfig` - all of the above plus learning rates and seeds.

``PRESETS`` holds the named studies of the forecast track (``smoke`` for tests and CI,
``quick`` for a few minutes, ``full`` for the real study - the rank sweep, RPKA's
ablations and the peers - ``quick-study``, the full study's arms at the quick size, and
``smoke-study``, its structure in miniature for tests) and ``LM_PRESETS`` the ``smoke`` /
``quick`` / ``full`` studies of the ``lm`` track - a study includes both tracks;
:func:`get_preset` (``name``, ``track_name``) returns one, with overrides, validated. Every
dataclass is ``dataclasses.asdict``-able and round-trips through JSON
(``BenchConfig.from_dict(json.loads(json.dumps(asdict(cfg)))) == cfg``), so notebooks take
their parameters from here and run files record them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

DEVICES = ("cpu", "cuda")
# each track's metrics, the default primary metric first (all: lower is better)
METRICS: dict[str, tuple[str, ...]] = {"forecast": ("mse", "mae"), "lm": ("perplexity", "nll")}
LR_SCHEDULES = ("cosine", "constant")


def _require(ok: bool, name: str, allowed: str, value: object) -> None:
    if not ok:
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class TrackConfig:
    """A forecasting track: the synthetic series, its windows and its splits.

    The generator (``rpka.tracks.forecast``) draws ``n_series`` independent univariate
    series of ``series_length`` steps; windows of ``context`` inputs and ``horizon``
    targets start every ``stride`` steps; each series is cut chronologically into train /
    validation / test segments and no window straddles two of them. (Several short series
    rather than one long one: every split then holds many regimes.)

    Generator parameters (all in units of the series' own scale, time in steps):
        season_period: the dominant (daily-like) period, used by the seasonal-naive
            forecast.
        season_harmonics: harmonics of ``season_period`` in its (fixed) waveform.
        weekly_period: a slow period that multiplies the daily amplitude (multiplicative
            seasonality).
        weekly_depth: depth of that modulation in [0, 1).
        regime_mean_length: mean length of a regime (geometric), in steps.
        regime_period_min, regime_period_max: each regime draws the period of its own
            oscillation uniformly from this range (a continuum, so no fixed linear filter
            extrapolates every regime - the nonlinear part of the task).
        regime_amplitude: scale of that oscillation's amplitude.
        noise_scale, noise_ar: innovation scale and lag-one coefficient of the AR(1) noise.
        seasonless_fraction: share of regimes without the daily season (only the regime's
            own oscillation, trend and noise). Which kind of regime a context shows is a
            nonlinear feature of it: the best forecast switches between two spectra, while
            a linear forecast has one filter for both.
        jump_scale: standard deviation of the level jump at a regime change.
        trend_scale, trend_ar: innovation scale and lag-one coefficient of the trend's slope
            (an AR(1) process, integrated into the level).
    """

    name: str = "forecast"
    n_series: int = 34
    series_length: int = 1_000
    stride: int = 8
    context: int = 96
    horizon: int = 24
    val_fraction: float = 0.2
    test_fraction: float = 0.2
    seed: int = 0
    season_period: int = 24
    season_harmonics: int = 3
    weekly_period: int = 168
    weekly_depth: float = 0.5
    regime_mean_length: int = 400
    regime_period_min: float = 12.0
    regime_period_max: float = 40.0
    regime_amplitude: float = 1.5
    noise_scale: float = 0.15
    noise_ar: float = 0.5
    seasonless_fraction: float = 0.4
    jump_scale: float = 0.1
    trend_scale: float = 0.0001
    trend_ar: float = 0.998

    @property
    def attention_tokens(self) -> int:
        """Tokens one attention call sees: one per context step."""
        return self.context

    def validate(self) -> None:
        _require(self.name == "forecast", "track.name", "'forecast'", self.name)
        _require(
            _is_int(self.n_series) and self.n_series >= 1, "track.n_series", ">= 1", self.n_series
        )
        _require(_is_int(self.context) and self.context >= 8, "track.context", ">= 8", self.context)
        _require(_is_int(self.horizon) and self.horizon >= 1, "track.horizon", ">= 1", self.horizon)
        _require(_is_int(self.stride) and self.stride >= 1, "track.stride", ">= 1", self.stride)
        for name in ("val_fraction", "test_fraction"):
            value = getattr(self, name)
            _require(_is_number(value) and 0 < value < 0.5, f"track.{name}", "in (0, 0.5)", value)
        _require(_is_int(self.seed) and self.seed >= 0, "track.seed", "an integer >= 0", self.seed)
        window = self.context + self.horizon
        shortest = self.series_length * min(self.val_fraction, self.test_fraction)
        _require(
            _is_int(self.series_length) and shortest >= window,
            "track.series_length",
            f"long enough that the smallest split holds one window ({window} steps)",
            self.series_length,
        )
        _require(
            _is_int(self.season_period) and 2 <= self.season_period <= self.context,
            "track.season_period",
            f"an integer in [2, context={self.context}]",
            self.season_period,
        )
        _require(
            _is_int(self.season_harmonics) and self.season_harmonics >= 1,
            "track.season_harmonics",
            ">= 1",
            self.season_harmonics,
        )
        _require(
            _is_int(self.weekly_period) and self.weekly_period >= 2,
            "track.weekly_period",
            ">= 2",
            self.weekly_period,
        )
        _require(
            _is_number(self.weekly_depth) and 0 <= self.weekly_depth < 1,
            "track.weekly_depth",
            "in [0, 1)",
            self.weekly_depth,
        )
        _require(
            _is_int(self.regime_mean_length) and self.regime_mean_length >= 1,
            "track.regime_mean_length",
            ">= 1",
            self.regime_mean_length,
        )
        _require(
            _is_number(self.regime_period_min)
            and _is_number(self.regime_period_max)
            and 2 <= self.regime_period_min <= self.regime_period_max,
            "track.regime_period_min/max",
            "2 <= min <= max",
            (self.regime_period_min, self.regime_period_max),
        )
        for name in (
            "regime_amplitude",
            "noise_scale",
            "jump_scale",
            "trend_scale",
        ):
            value = getattr(self, name)
            _require(_is_number(value) and value >= 0, f"track.{name}", ">= 0", value)
        for name in ("noise_ar", "trend_ar"):
            value = getattr(self, name)
            _require(_is_number(value) and -1 < value < 1, f"track.{name}", "in (-1, 1)", value)
        _require(
            _is_number(self.seasonless_fraction) and 0 <= self.seasonless_fraction <= 1,
            "track.seasonless_fraction",
            "in [0, 1]",
            self.seasonless_fraction,
        )


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
            _require(
                _is_int(value) and value >= low, f"track.{name}", f"an integer >= {low}", value
            )

        _require(self.name == "lm", "track.name", "'lm'", self.name)
        at_least("vocab_size", 2)
        at_least("copy_length", 1)
        at_least("seq_len", 2)
        for name in ("n_train", "n_val", "n_test"):
            at_least(name, 1)
        at_least("seed", 0)
        _require(
            _is_int(self.order) and 1 <= self.order <= 3, "track.order", "1, 2 or 3", self.order
        )
        _require(
            isinstance(self.lags, tuple) and len(self.lags) >= 1,
            "track.lags",
            "a non-empty tuple of integers",
            self.lags,
        )
        for lag in self.lags:
            _require(_is_int(lag) and lag >= 1, "track.lags: each lag", "an integer >= 1", lag)
        _require(
            _is_number(self.marker_prob) and 0.0 <= self.marker_prob < 1.0,
            "track.marker_prob",
            "in [0, 1)",
            self.marker_prob,
        )
        _require(
            _is_number(self.concentration) and self.concentration > 0,
            "track.concentration",
            "> 0",
            self.concentration,
        )


# the configuration class of each track, by name (``BenchConfig.track`` is one of them)
TRACK_CONFIGS: dict[str, type] = {"forecast": TrackConfig, "lm": LMConfig}


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
    head_init_std: standard deviation of the flatten head's initial weights (GPT-2's 0.02
        by default). Its fan-in is context x d_model, so the initial output's scale grows
        like the square root of the context: at 2,048 tokens 0.02 starts every forecast
        with a standard deviation of ~3.6 (MSE ~13 on standardised targets) that a short
        run cannot unlearn. 0 starts the model as its linear skip (a zero-initialised
        output layer, as in ReZero / Fixup); the long-context presets use it.
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

    def validate(self) -> None:
        _require(self.name == "transformer_tiny", "model.name", "'transformer_tiny'", self.name)
        for name in ("d_model", "n_layers", "n_heads", "d_ff"):
            value = getattr(self, name)
            _require(_is_int(value) and value >= 1, f"model.{name}", ">= 1", value)
        _require(
            self.d_model % self.n_heads == 0,
            "model.d_model",
            f"a multiple of n_heads={self.n_heads}",
            self.d_model,
        )
        _require(
            _is_int(self.embed_kernel) and self.embed_kernel >= 1 and self.embed_kernel % 2 == 1,
            "model.embed_kernel",
            "an odd integer >= 1",
            self.embed_kernel,
        )
        _require(
            _is_number(self.dropout) and 0 <= self.dropout < 1,
            "model.dropout",
            "in [0, 1)",
            self.dropout,
        )
        _require(
            isinstance(self.linear_skip, bool), "model.linear_skip", "a bool", self.linear_skip
        )
        _require(
            _is_number(self.head_init_std) and self.head_init_std >= 0,
            "model.head_init_std",
            ">= 0",
            self.head_init_std,
        )


@dataclass(frozen=True)
class TrainConfig:
    """Adam on the track's loss (forecast: MSE of the standardised horizon; lm: cross-entropy).

    lr_schedule: ``"cosine"`` (the learning rate decays to 0 along a half cosine over
        all steps - short runs end at a settled point instead of wherever the last noisy
        step left them) or ``"constant"``.
    grad_clip: per-member gradient-norm clip (0 disables it).
    warmup_steps: steps excluded from the median step time (allocations, caches).
    eval_batch_size: windows per forward pass when scoring (no gradients).
    """

    epochs: int = 4
    batch_size: int = 32
    eval_batch_size: int = 256
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    lr_schedule: str = "cosine"
    grad_clip: float = 1.0
    warmup_steps: int = 3

    def validate(self) -> None:
        for name in ("epochs", "batch_size", "eval_batch_size"):
            value = getattr(self, name)
            _require(_is_int(value) and value >= 1, f"train.{name}", ">= 1", value)
        _require(
            len(self.betas) == 2 and all(_is_number(b) and 0 <= b < 1 for b in self.betas),
            "train.betas",
            "two numbers in [0, 1)",
            self.betas,
        )
        _require(_is_number(self.eps) and self.eps > 0, "train.eps", "> 0", self.eps)
        _require(
            self.lr_schedule in LR_SCHEDULES,
            "train.lr_schedule",
            f"one of {LR_SCHEDULES}",
            self.lr_schedule,
        )
        for name in ("weight_decay", "grad_clip"):
            value = getattr(self, name)
            _require(_is_number(value) and value >= 0, f"train.{name}", ">= 0", value)
        _require(
            _is_int(self.warmup_steps) and self.warmup_steps >= 0,
            "train.warmup_steps",
            ">= 0",
            self.warmup_steps,
        )


@dataclass(frozen=True)
class ArmConfig:
    """One arm of the comparison: an attention method and its options.

    ``name`` labels the arm in results ("exact", "rpka-r16"); ``method`` is a key of
    ``rpka.attention.REGISTRY``; ``options`` are passed to ``rpka.attention.build``.
    ``sweep_seeds``: this arm's learning-rate sweep uses these seeds, a subset of the
    study's (None: all of them) - a cheaper sweep where the time budget asks for one (one
    seed proved too noisy here: see the full preset's note).
    ``lr_from``: no sweep of its own - the arm takes the learning rate chosen for the arm
    of that name (which must sweep itself) and trains only it with its sweep seeds (which
    still score it on validation). An ablation thus runs at its reference's tuned rate.
    """

    name: str
    method: str
    options: dict[str, Any] = field(default_factory=dict)
    sweep_seeds: tuple[int, ...] | None = None
    lr_from: str | None = None

    def validate(self) -> None:
        from rpka.attention import options_of  # late: keeps presets importable alone

        _require(isinstance(self.name, str) and self.name != "", "arm.name", "a name", self.name)
        try:
            valid = options_of(self.method)
        except ValueError as err:
            raise ValueError(f"arm {self.name!r}: {err}") from None
        unknown = sorted(set(self.options) - set(valid) - {"generator"})
        _require(
            not unknown,
            f"arm {self.name!r} options",
            f"among {sorted(set(valid) - {'generator', 'causal', 'check_inputs'})}",
            unknown,
        )
        _require(
            "generator" not in self.options,
            f"arm {self.name!r} options",
            "without a generator (the run seeds it)",
            sorted(self.options),
        )
        if "rank" in self.options:
            rank = self.options["rank"]
            _require(_is_int(rank) and rank >= 1, f"arm {self.name!r} rank", ">= 1", rank)
        if self.sweep_seeds is not None:
            _require(
                isinstance(self.sweep_seeds, tuple)
                and len(self.sweep_seeds) >= 1
                and len(set(self.sweep_seeds)) == len(self.sweep_seeds),
                f"arm {self.name!r} sweep_seeds",
                "None or a non-empty tuple of distinct seeds",
                self.sweep_seeds,
            )


def rpka_arm(rank: int, label: str | None = None, **options: Any) -> ArmConfig:
    """The arm ``rpka-r<rank>`` (RPKA with default options), or ``rpka-r<rank>-<label>``."""
    name = f"rpka-r{rank}" if label is None else f"rpka-r{rank}-{label}"
    return ArmConfig(name, "rpka", {"rank": rank, **options})


def peer_arm(method: str, rank: int, **options: Any) -> ArmConfig:
    """The arm ``<method>-r<rank>``: a peer method at rank (landmarks / features) ``rank``."""
    return ArmConfig(f"{method}-r{rank}", method, {"rank": rank, **options})


EXACT = ArmConfig("exact", "exact", {})
# the control: uniform attention (q = 0) at exact's tuned rate - how much the track needs
# attention at all; an approximation cannot beat exact by more than exact beats this
MEAN_CONTROL = ArmConfig("mean-attention", "mean", {}, lr_from="exact")

# The ablation study varies one choice of RPKA at a time around its default configuration
# (gauss weighting, joint pivot set, rpc rule, pivots drawn at every call) at ONE rank,
# r = 16: the cheapest rank at which the approximation still matters at the training shape
# (96 tokens, 192 joint pivot points) while the choices remain visible - 16 of 192 points
# is genuinely low-rank. Measured on the quick-study preset's trained models (relative
# attention output error against exact, mean over layers, heads, windows and draws):
# r = 4: 0.19, r = 16: 0.011 (0.012-0.015 for the exp/tempered/keys/greedy/batch
# ablations, 0.027 with uniform landmarks), r = 64: 2e-4 - at r = 64 every choice is
# near exact, at r = 4 the rank deficit dominates. The default arm ``rpka-r16`` doubles as
# the ablations' reference; the peers run at the same rank (landmarks, segments or
# random features).
ABLATION_RANK = 16
# (label, options) of each ablation: one factor changed from RPKA's default
ABLATIONS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("exp", {"weighting": "exp"}),  # pivots ~ the exponential kernel's residual (DESIGN 2)
    ("tempered", {"weighting": "tempered", "tempering": 0.5}),  # ~ its square root
    ("keys", {"pivot_set": "keys"}),  # pivots from the keys only (WildCat-style set)
    ("greedy", {"pivot_rule": "greedy"}),  # argmax residual instead of sampling
    ("batch-pivots", {"pivot_refresh": "batch"}),  # one draw per batch, shared by the layers
)
# The pivot-rule ablation's "uniform" level is the peer nystrom-uniform: by construction
# RPKA with pivot_rule="uniform" (rpka.attention.nystrom_uniform), so it is not run twice.
PEERS = ("nystrom-uniform", "keys-coreset", "nystromformer", "performer")


def ablation_arms(rank: int = ABLATION_RANK) -> tuple[ArmConfig, ...]:
    """The ablation arms ``rpka-r<rank>-<label>`` (the reference ``rpka-r<rank>`` excluded)."""
    return tuple(rpka_arm(rank, label, **options) for label, options in ABLATIONS)


def peer_arms(rank: int = ABLATION_RANK) -> tuple[ArmConfig, ...]:
    """Every peer method at ``rank``: ``<method>-r<rank>``."""
    return tuple(peer_arm(method, rank) for method in PEERS)


@dataclass(frozen=True)
class BenchConfig:
    """A whole study: track, model, training, arms, learning rates and seeds.

    ``track`` is a :class:`TrackConfig` (track ``forecast``) or an :class:`LMConfig` (track
    ``lm``, the causal decoder); ``metric`` is one of that track's ``METRICS``.
    sweep_seeds score every learning rate on validation; eval_seeds (disjoint from them)
    train the best learning rate of each arm and score it on test. ``primary_arm`` is the
    arm reported under ``idea`` / ``comparison``; ``baseline_arm`` is the reference.
    ``n_workers`` processes run jobs in parallel (1 = in this process);
    ``seeds_per_job`` seeds are stacked in one model per job (more seeds per job: less
    overhead; fewer: better load balance across workers).
    """

    preset: str
    track: TrackConfig | LMConfig
    model: ModelConfig
    train: TrainConfig
    arms: tuple[ArmConfig, ...]
    primary_arm: str
    baseline_arm: str = "exact"
    learning_rates: tuple[float, ...] = (1e-3, 3e-3, 1e-2)
    sweep_seeds: tuple[int, ...] = (0, 1)
    eval_seeds: tuple[int, ...] = tuple(range(100, 108))
    metric: str = "mse"
    device: str = "cpu"
    n_workers: int = 2
    seeds_per_job: int = 4
    # overrides of rpka.mechanism.MechanismConfig for the study of the primary arm's
    # trained model (empty: the full study's defaults); None skips the study
    mechanism: dict[str, Any] | None = field(default_factory=dict)
    # RPKA's default is chosen on validation among ablation_reference (the current default
    # configuration) and ablation_arms (alternatives, one choice changed each); None: no choice
    ablation_reference: str | None = None
    ablation_arms: tuple[str, ...] = ()
    # ranks at which every arm's attention is compared with exact on its trained Q/K
    # (rpka.mechanism.method_output_errors; non-causal forecast models); () skips the study
    output_error_ranks: tuple[int, ...] = ()

    @property
    def track_name(self) -> str:
        """``forecast`` or ``lm`` (the name of ``self.track``)."""
        return self.track.name

    def validate(self) -> None:
        _require(
            isinstance(self.track, tuple(TRACK_CONFIGS.values())),
            "track",
            f"one of {[c.__name__ for c in TRACK_CONFIGS.values()]}",
            type(self.track).__name__,
        )
        self.track.validate()
        self.model.validate()
        self.train.validate()
        _require(len(self.arms) >= 1, "arms", "a non-empty list", self.arms)
        for arm in self.arms:
            arm.validate()
        if self.track_name == "lm":
            self._validate_lm()
        names = [arm.name for arm in self.arms]
        _require(len(set(names)) == len(names), "arms", "uniquely named", names)
        for arm in self.arms:
            extra = sorted(set(arm.sweep_seeds or ()) - set(self.sweep_seeds))
            _require(not extra, f"arm {arm.name!r} sweep_seeds", "a subset of sweep_seeds", extra)
            if arm.lr_from is not None:
                sources = [a.name for a in self.arms if a.lr_from is None and a is not arm]
                _require(
                    arm.lr_from in sources,
                    f"arm {arm.name!r} lr_from",
                    f"another arm that sweeps its own learning rate, one of {sources}",
                    arm.lr_from,
                )
        _require(self.baseline_arm in names, "baseline_arm", f"one of {names}", self.baseline_arm)
        _require(self.primary_arm in names, "primary_arm", f"one of {names}", self.primary_arm)
        _require(
            len(self.learning_rates) >= 1
            and all(_is_number(lr) and 0 < lr for lr in self.learning_rates),
            "learning_rates",
            "positive numbers (at least one)",
            self.learning_rates,
        )
        _require(
            len(set(self.learning_rates)) == len(self.learning_rates),
            "learning_rates",
            "distinct",
            self.learning_rates,
        )
        for name in ("sweep_seeds", "eval_seeds"):
            seeds = getattr(self, name)
            _require(
                len(seeds) >= 1 and all(_is_int(s) and s >= 0 for s in seeds),
                name,
                "non-negative integers (at least one)",
                seeds,
            )
            _require(len(set(seeds)) == len(seeds), name, "distinct", seeds)
        if self.mechanism is not None:
            from rpka.mechanism import MechanismConfig  # local: presets stay light to import

            allowed = {f.name for f in fields(MechanismConfig)}
            bad = sorted(set(self.mechanism) - allowed)
            _require(not bad, "mechanism", f"keys among {sorted(allowed)}", bad)
        if self.ablation_reference is None:
            _require(
                not self.ablation_arms,
                "ablation_arms",
                "empty without an ablation_reference",
                self.ablation_arms,
            )
        else:
            _require(
                self.ablation_reference in names,
                "ablation_reference",
                f"one of {names}",
                self.ablation_reference,
            )
            unknown = sorted(set(self.ablation_arms) - set(names))
            _require(not unknown, "ablation_arms", f"arms among {names}", unknown)
            _require(
                self.ablation_reference not in self.ablation_arms
                and len(set(self.ablation_arms)) == len(self.ablation_arms),
                "ablation_arms",
                "distinct and without the ablation_reference",
                self.ablation_arms,
            )
            candidates = [self.arm(n) for n in (self.ablation_reference, *self.ablation_arms)]
            shared = set(self.sweep_seeds).intersection(
                *(set(a.sweep_seeds or self.sweep_seeds) for a in candidates)
            )
            _require(
                bool(shared),
                "ablation arms' sweep_seeds",
                "sharing at least one seed with the reference's (the choice compares them)",
                {a.name: a.sweep_seeds for a in candidates},
            )
        _require(
            all(_is_int(r) and r >= 1 for r in self.output_error_ranks)
            and (not self.output_error_ranks or self.track_name == "forecast"),
            "output_error_ranks",
            "positive integers (or empty; the study compares non-causal attention, track "
            "forecast only)",
            self.output_error_ranks,
        )
        shared = sorted(set(self.sweep_seeds) & set(self.eval_seeds))
        _require(not shared, "eval_seeds", "disjoint from sweep_seeds", shared)
        metrics = METRICS[self.track_name]
        _require(self.metric in metrics, "metric", f"one of {metrics} for this track", self.metric)
        _require(self.device in DEVICES, "device", f"one of {DEVICES}", self.device)
        _require(
            _is_int(self.n_workers) and self.n_workers >= 1, "n_workers", ">= 1", self.n_workers
        )
        _require(
            _is_int(self.seeds_per_job) and self.seeds_per_job >= 1,
            "seeds_per_job",
            ">= 1",
            self.seeds_per_job,
        )

    def _validate_lm(self) -> None:
        """A causal decoder: token embedding of width 1, no skip, causal attention."""
        from rpka.attention import build  # late: keeps presets importable alone

        _require(
            self.model.embed_kernel == 1 and not self.model.linear_skip,
            "model (track lm)",
            "embed_kernel=1 and linear_skip=False (a token embeds itself; no horizon skip)",
            (self.model.embed_kernel, self.model.linear_skip),
        )
        for arm in self.arms:
            try:
                build(arm.method, causal=True, **arm.options)
            except ValueError as err:
                raise ValueError(f"arm {arm.name!r} cannot run on track lm: {err}") from None

    def arm(self, name: str) -> ArmConfig:
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise ValueError(f"no arm named {name!r}; arms: {[a.name for a in self.arms]}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BenchConfig:
        """Inverse of ``dataclasses.asdict`` (also after a JSON round trip)."""
        data = dict(data)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        _require(not unknown, "BenchConfig keys", f"among {sorted(known)}", unknown)
        track = dict(data["track"])
        kind = track.get("name", "forecast")
        _require(kind in TRACK_CONFIGS, "track.name", f"one of {sorted(TRACK_CONFIGS)}", kind)
        data["track"] = TRACK_CONFIGS[kind](**track)
        data["model"] = ModelConfig(**data["model"])
        train = dict(data["train"])
        if "betas" in train:
            train["betas"] = tuple(train["betas"])
        data["train"] = TrainConfig(**train)
        data["arms"] = tuple(
            ArmConfig(**{**arm, "sweep_seeds": _tuple_or_none(arm.get("sweep_seeds"))})
            for arm in data["arms"]
        )
        for key in TUPLE_FIELDS:
            if key in data:
                data[key] = tuple(data[key])
        return cls(**data)


def _tuple_or_none(value: Any) -> tuple | None:
    return None if value is None else tuple(value)


TUPLE_FIELDS = (
    "learning_rates",
    "sweep_seeds",
    "eval_seeds",
    "ablation_arms",
    "output_error_ranks",
)


def _smoke() -> BenchConfig:
    return BenchConfig(
        preset="smoke",
        track=TrackConfig(n_series=8, series_length=400, context=32, horizon=8),
        model=ModelConfig(d_model=16, n_layers=1, n_heads=2, d_ff=32, embed_kernel=3),
        train=TrainConfig(epochs=2, batch_size=32, warmup_steps=1),
        arms=(EXACT, rpka_arm(4)),
        primary_arm="rpka-r4",
        learning_rates=(3e-3,),
        sweep_seeds=(0,),
        eval_seeds=(100, 101),
        n_workers=1,
        mechanism={"rank": 4, "draws": 200, "quality_ranks": [2, 4, 8], "quality_seeds": 3},
        output_error_ranks=(4, 16),
    )


def _smoke_study() -> BenchConfig:
    """The full study's structure in seconds: one ablation, the uniform rule, one peer, the
    control."""
    return dataclasses.replace(
        _smoke(),
        preset="smoke-study",
        arms=(
            EXACT,
            rpka_arm(4),
            dataclasses.replace(rpka_arm(4, "greedy", pivot_rule="greedy"), lr_from="rpka-r4"),
            dataclasses.replace(peer_arm("nystrom-uniform", 4), lr_from="rpka-r4"),
            peer_arm("performer", 4),
            MEAN_CONTROL,
        ),
        ablation_reference="rpka-r4",
        ablation_arms=("rpka-r4-greedy", "nystrom-uniform-r4"),
    )


def _quick() -> BenchConfig:
    return BenchConfig(
        preset="quick",
        track=TrackConfig(n_series=16),
        model=ModelConfig(),
        train=TrainConfig(),
        arms=(EXACT, rpka_arm(4), rpka_arm(16)),
        primary_arm="rpka-r16",
        learning_rates=(1e-3, 3e-3),
        sweep_seeds=(0, 1),
        eval_seeds=(100, 101, 102, 103),
        mechanism={"rank": 16, "draws": 500, "quality_ranks": [4, 8, 16, 32], "quality_seeds": 5},
    )


# Time budget of the full preset on the project's 2-core CPU machine: <= 15 minutes. With
# 13 arms, each sweeping 3 learning rates x 2 seeds, it was estimated at ~16 min
# (scripts/estimate_bench_cost.py), so two cuts, judged least harmful:
# 1. The ablations (and nystrom-uniform, the ablation of the pivot rule) do not sweep: they
#    take the learning rate chosen for their reference rpka-r16 (ArmConfig.lr_from) - the
#    usual ablation protocol, one choice changed at the reference's tuned setting - and
#    train it with both sweep seeds, so the default choice still compares every candidate
#    on the same seeds and learning rate. Every arm keeps all 8 evaluation seeds (the paired
#    comparisons keep their power); the rank sweep, the primary arm and the other peers
#    keep the full tuning budget. (Sweeping with one seed instead was tried and rejected:
#    on the quick-study preset seed 0 alone preferred lr 1e-3 where two seeds chose 3e-3,
#    and every one-seed arm trained at the worse rate: about +0.018 test MSE.)
# 2. rpka-r64 selects its pivots with the plain one-pivot-per-step loop: the same pivot
# law as the accelerated (block + rejection) path, but at 64 of 192 points rejection wastes
# most candidates - one epoch of an evaluation job measured 48 vs 60 CPU-s (-20 %; at r = 16
# and 32 the accelerated path is as fast or faster). Long-sequence timings
# (rpka.scaling.bench_arms_config) reset it to the default fast path.
R64_PIVOT_METHOD = "plain"


def _full() -> BenchConfig:
    ablations, peers = ablation_arms(), peer_arms()
    reference = f"rpka-r{ABLATION_RANK}"
    uniform = f"nystrom-uniform-r{ABLATION_RANK}"  # the pivot rule's "uniform" level
    ablations = tuple(dataclasses.replace(a, lr_from=reference) for a in ablations)
    peers = tuple(
        dataclasses.replace(a, lr_from=reference) if a.name == uniform else a for a in peers
    )
    return BenchConfig(
        preset="full",
        track=TrackConfig(),
        model=ModelConfig(),
        train=TrainConfig(),
        arms=(
            EXACT,
            rpka_arm(4),
            rpka_arm(16),
            rpka_arm(64, pivot_method=R64_PIVOT_METHOD),
            *ablations,
            *peers,
            MEAN_CONTROL,
        ),
        primary_arm="rpka-r64",
        learning_rates=(1e-3, 3e-3, 1e-2),
        sweep_seeds=(0, 1),
        eval_seeds=tuple(range(100, 108)),
        output_error_ranks=(16, 64, 128),
        ablation_reference=reference,
        ablation_arms=tuple(a.name for a in ablations) + (uniform,),
    )


def _quick_study() -> BenchConfig:
    """The full study's arms at the quick preset's size (minutes): a preview of the report."""
    return dataclasses.replace(
        _full(),
        preset="quick-study",
        track=TrackConfig(n_series=16),
        learning_rates=(1e-3, 3e-3),
        eval_seeds=(100, 101, 102, 103),
        mechanism=_quick().mechanism,
    )


PRESETS: dict[str, BenchConfig] = {
    "smoke": _smoke(),
    "smoke-study": _smoke_study(),
    "quick": _quick(),
    "quick-study": _quick_study(),
    "full": _full(),
}


# --------------------------------------------------------------------------- track lm
#
# The causal decoder on the Markov-copy source (issue 7), sized for about 4 minutes of the
# full study on 2 CPU cores. Sequences of 65 tokens (the model reads 64): 16 content tokens
# (a bigram table the d_model=32 head can represent), two copy lags (16, 32) chosen by the
# marker, markers with probability 0.2 and copies of 16 tokens - so about three quarters of
# the tokens are copies, whose gradient signal makes the copy circuit appear within the
# first few epochs on every seed (with rarer, shorter copies it appeared late, on some seeds
# only). In the quick preset (README) exact attention closes three quarters of the test-NLL
# gap between the bigram model and the floor in 12 epochs, causal RPKA r=32 nearly as much,
# r=16 clearly less.
#
# Every copy lag is >= the causal block, so a copied token always lies in an earlier block:
# copying goes through the landmarks (the approximate part of causal RPKA), never through
# the exact local block. LM_CAUSAL_BLOCK = 16 cuts the 64 attention tokens into 4 blocks;
# the last block draws its landmarks from 48 earlier positions (96 joint points), of which
# rank 16 keeps a sixth and rank 32 a third. Rank 64 would keep two thirds (nearly exact
# attention) at 5x the training step of rank 16 (its pivot loop is sequential): out of the
# time budget, and uninformative at this length.
LM_CAUSAL_BLOCK = 16
LM_TRACK = LMConfig(
    vocab_size=16,
    lags=(16, 32),
    copy_length=16,
    marker_prob=0.2,
    seq_len=65,
    n_train=1024,
    n_val=128,
    n_test=256,
)
LM_MODEL = ModelConfig(
    d_model=32, n_layers=2, n_heads=2, d_ff=64, embed_kernel=1, linear_skip=False
)
LM_TRAIN = TrainConfig(epochs=12, batch_size=32)


def lm_rpka_arm(rank: int) -> ArmConfig:
    """Causal RPKA at ``rank`` with the lm track's causal block."""
    return rpka_arm(rank, causal_block=LM_CAUSAL_BLOCK)


def _lm_smoke() -> BenchConfig:
    return BenchConfig(
        preset="smoke",
        track=LMConfig(vocab_size=12, lags=(8, 12), seq_len=33, n_train=64, n_val=16, n_test=16),
        model=ModelConfig(
            d_model=16, n_layers=1, n_heads=2, d_ff=32, embed_kernel=1, linear_skip=False
        ),
        train=TrainConfig(epochs=2, batch_size=16, warmup_steps=1),
        arms=(EXACT, rpka_arm(4, causal_block=8)),
        primary_arm="rpka-r4",
        learning_rates=(3e-3,),
        sweep_seeds=(0,),
        eval_seeds=(100, 101),
        metric="perplexity",
        n_workers=1,
        mechanism={"rank": 4, "draws": 200, "quality_ranks": [2, 4, 8], "quality_seeds": 3},
    )


def _lm_quick() -> BenchConfig:
    """The full lm study's runs (same data, model, training) with one learning rate and four
    evaluation seeds: its per-run CPU times estimate the full study's."""
    return dataclasses.replace(
        _lm_full(),
        preset="quick",
        learning_rates=(1e-2,),
        sweep_seeds=(0,),
        eval_seeds=(100, 101, 102, 103),
    )


def _lm_full() -> BenchConfig:
    return BenchConfig(
        preset="full",
        track=LM_TRACK,
        model=LM_MODEL,
        train=LM_TRAIN,
        arms=(EXACT, lm_rpka_arm(16), lm_rpka_arm(32), MEAN_CONTROL),
        primary_arm="rpka-r32",
        learning_rates=(3e-3, 1e-2, 3e-2),  # 1e-2 won a two-point grid: extended upward
        sweep_seeds=(0, 1),
        eval_seeds=tuple(range(100, 108)),
        metric="perplexity",
        mechanism=None,  # the mechanism study is the forecast track's
    )


LM_PRESETS: dict[str, BenchConfig] = {
    "smoke": _lm_smoke(),
    "quick": _lm_quick(),
    "full": _lm_full(),
}
# every study preset, by track: ``get_preset(name, track_name)`` looks it up here
PRESETS_BY_TRACK: dict[str, dict[str, BenchConfig]] = {"forecast": PRESETS, "lm": LM_PRESETS}


def get_preset(name: str, track_name: str = "forecast", **overrides: Any) -> BenchConfig:
    """The preset ``name`` of track ``track_name``, with fields replaced by ``overrides``,
    validated.

    ``track_name`` is ``"forecast"`` (the primary track) or ``"lm"``; the study ``full``
    includes both. Nested configs are replaced whole (``track=LMConfig(...)``) or field by
    field with a dict (``train={"epochs": 3}``). ``ranks=[4, 16]`` is a shorthand that
    replaces the rank sweep - the arms named ``rpka-r<rank>``; a requested rank keeps its
    arm as it is, a new one takes the preset's RPKA options such as ``causal_block`` - keeping
    every other arm and the ablation reference (the ablations need it), and makes the
    largest rank the primary arm unless ``primary_arm`` is given.
    """
    _require(
        track_name in PRESETS_BY_TRACK,
        "track_name",
        f"one of {sorted(PRESETS_BY_TRACK)}",
        track_name,
    )
    presets = PRESETS_BY_TRACK[track_name]
    if name not in presets:
        raise ValueError(
            f"preset must be one of {sorted(presets)} for track {track_name!r}, got {name!r}"
        )
    return apply_overrides(presets[name], **overrides)


def apply_overrides(config: BenchConfig, **overrides: Any) -> BenchConfig:
    """``config`` with overrides as :func:`get_preset` takes them, validated."""
    overrides = dict(overrides)
    ranks = overrides.pop("ranks", None)
    if ranks is not None:
        ranks = list(ranks)
        _require(
            len(ranks) >= 1 and all(_is_int(r) and r >= 1 for r in ranks),
            "ranks",
            "positive integers (at least one)",
            ranks,
        )
        reference = overrides.get("ablation_reference", config.ablation_reference)
        swept = [
            a
            for a in config.arms
            if a.method == "rpka" and a.name == f"rpka-r{a.options.get('rank')}"
        ]
        shared = {k: v for k, v in (swept[0].options if swept else {}).items() if k != "rank"}
        wanted = {f"rpka-r{r}" for r in ranks} | {reference}  # swept arms kept as they are
        dropped = {a.name for a in swept} - wanted
        others = [a for a in config.arms if a.name not in dropped]
        kept = {a.name for a in others}
        new_arms = [rpka_arm(r, **shared) for r in sorted(set(ranks)) if f"rpka-r{r}" not in kept]
        overrides["arms"] = tuple(others) + tuple(new_arms)
        overrides.setdefault("primary_arm", f"rpka-r{max(ranks)}")
    known = {f.name for f in fields(BenchConfig)}
    unknown = sorted(set(overrides) - known)
    _require(not unknown, "override", f"among {sorted(known | {'ranks'})}", unknown)
    nested = {"track": type(config.track), "model": ModelConfig, "train": TrainConfig}
    for key, value in list(overrides.items()):
        if key in nested and isinstance(value, Mapping):
            current = getattr(config, key)
            allowed = {f.name for f in fields(current)}
            bad = sorted(set(value) - allowed)
            _require(not bad, f"{key} override", f"among {sorted(allowed)}", bad)
            overrides[key] = dataclasses.replace(current, **value)
        elif key in (*TUPLE_FIELDS, "arms"):
            overrides[key] = tuple(value)
    config = dataclasses.replace(config, **overrides)
    config.validate()
    return config


# --------------------------------------------------------------------------- long context
# The long-context training study (issue 6, item 4; ``rpka.longctx``): one bench per
# context length, every context sharing the template ``BenchConfig`` of its preset.


def sized_track(
    track: TrackConfig, context: int, train_windows: int, eval_windows: int
) -> TrackConfig:
    """``track`` at ``context``, its series just long enough for the windows asked for.

    Every series holds exactly ``train_windows`` training windows and ``eval_windows``
    windows in each of validation and test (one every ``track.stride`` steps), whatever
    the context: a split of ``w + (k - 1) * stride`` steps holds k windows of
    ``w = context + horizon`` steps, and the series is the three splits end to end.
    """
    for name, value in (("train_windows", train_windows), ("eval_windows", eval_windows)):
        _require(_is_int(value) and value >= 1, name, ">= 1", value)
    _require(_is_int(context) and context >= 8, "context", ">= 8", context)
    window = context + track.horizon
    train_steps = window + (train_windows - 1) * track.stride
    eval_steps = window + (eval_windows - 1) * track.stride
    length = train_steps + 2 * eval_steps
    # split_bounds rounds length * fraction back to eval_steps exactly (the error is ~1e-12)
    fraction = eval_steps / length
    return dataclasses.replace(
        track,
        context=context,
        series_length=length,
        val_fraction=fraction,
        test_fraction=fraction,
    )


@dataclass(frozen=True)
class LongContextConfig:
    """Exact against RPKA when training at long context: one bench per context length.

    ``bench`` is the template every context shares - model, training, arms, learning
    rates, seeds, workers (its ``mechanism`` study is off: the long-context study measures
    cost and accuracy only). :meth:`bench_for` sets the track's context and sizes its
    series (:func:`sized_track`) so every context trains on the same number of windows,
    hence the same number of steps. ``memory_probe`` measures the peak memory of one
    training step of every arm (``rpka.longctx.training_step_peak_mib``).
    """

    preset: str
    contexts: tuple[int, ...]
    bench: BenchConfig
    train_windows: int
    eval_windows: int
    memory_probe: bool = True

    def validate(self) -> None:
        _require(
            len(self.contexts) >= 1
            and all(_is_int(c) and c >= 8 for c in self.contexts)
            and len(set(self.contexts)) == len(self.contexts),
            "contexts",
            "distinct integers >= 8 (at least one)",
            self.contexts,
        )
        _require(isinstance(self.memory_probe, bool), "memory_probe", "a bool", self.memory_probe)
        for context in self.contexts:
            self.bench_for(context)  # validates the sized track and the whole bench

    def bench_for(self, context: int) -> BenchConfig:
        """The bench at ``context`` (validated)."""
        track = sized_track(self.bench.track, context, self.train_windows, self.eval_windows)
        config = dataclasses.replace(self.bench, track=track)
        config.validate()
        return config

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LongContextConfig:
        """Inverse of ``dataclasses.asdict`` (also after a JSON round trip)."""
        data = dict(data)
        data["bench"] = BenchConfig.from_dict(data["bench"])
        data["contexts"] = tuple(data["contexts"])
        return cls(**data)


def rank_sweep(config: BenchConfig) -> BenchConfig:
    """``config`` with only its baseline and its rank sweep ``rpka-r<rank>`` at default options.

    No ablations, peers, ablation choice or output-error study: the long-context study
    varies the context length, not RPKA's choices (and the full preset's training-shape
    implementation choices, such as rpka-r64's plain pivot loop, do not carry over).
    """
    swept = [
        rpka_arm(a.options["rank"])
        for a in config.arms
        if a.method == "rpka" and a.name == f"rpka-r{a.options.get('rank')}"
    ]
    return dataclasses.replace(
        config,
        arms=(config.arm(config.baseline_arm), *swept),
        ablation_reference=None,
        ablation_arms=(),
        output_error_ranks=(),
    )


def _longctx(
    preset: str,
    contexts: tuple[int, ...],
    train_windows: int,
    eval_windows: int,
    **bench: Any,
) -> LongContextConfig:
    """A long-context preset: the full bench preset's rank sweep with the reduced protocol's
    overrides."""
    template = apply_overrides(
        rank_sweep(PRESETS["full"]),
        preset=f"longctx-{preset}",
        mechanism=None,
        **{"track": sized_track(TrackConfig(**bench.pop("track", {})), contexts[0], 1, 1)},
        **bench,
    )
    config = LongContextConfig(preset, contexts, template, train_windows, eval_windows)
    config.validate()
    return config


# Reduced protocol (the CPU cannot afford the main study's at 2,048 tokens): one encoder
# layer of width 16 with one head, 4 series, 2 epochs, learning rates {1e-4, 3e-4} on one
# sweep seed, 4 evaluation seeds; ``full`` takes about 5 minutes on the 2-core machine.
# The flatten head starts at zero (see ModelConfig.head_init_std) and there is no linear
# skip: with 96 training windows per series its context x horizon weights overfit (test
# MSE 0.61 with it, 0.50 without, exact at 2,048 tokens, 2 seeds), and without it every
# forecast goes through the attention.
_LONGCTX_MODEL = {
    "d_model": 16,
    "n_layers": 1,
    "n_heads": 1,
    "d_ff": 32,
    "head_init_std": 0.0,
    "linear_skip": False,
}
LONGCTX_PRESETS: dict[str, LongContextConfig] = {
    "smoke": _longctx(
        "smoke",
        contexts=(32, 64),
        train_windows=8,
        eval_windows=2,
        track={"n_series": 2, "stride": 8},
        model={**_LONGCTX_MODEL, "d_model": 8, "d_ff": 16, "embed_kernel": 3},
        train={"epochs": 1, "batch_size": 8, "warmup_steps": 0},
        ranks=(4, 8),
        learning_rates=(3e-3,),
        sweep_seeds=(0,),
        eval_seeds=(100, 101),
        n_workers=1,
        seeds_per_job=2,
    ),
    "quick": _longctx(
        "quick",
        contexts=(512, 2048),
        train_windows=48,
        eval_windows=8,
        track={"n_series": 2, "stride": 32},
        model=_LONGCTX_MODEL,
        train={"epochs": 1, "batch_size": 16, "warmup_steps": 1},
        ranks=(16, 64, 128),
        primary_arm="rpka-r64",  # the main study's primary arm
        learning_rates=(1e-4, 3e-4),
        sweep_seeds=(0,),
        eval_seeds=(100, 101),
        seeds_per_job=2,
    ),
    "full": _longctx(
        "full",
        contexts=(512, 2048),
        train_windows=96,
        eval_windows=16,
        track={"n_series": 4, "stride": 32},
        model=_LONGCTX_MODEL,
        train={"epochs": 2, "batch_size": 16, "warmup_steps": 2},
        ranks=(16, 64, 128),
        primary_arm="rpka-r64",  # the main study's primary arm
        learning_rates=(1e-4, 3e-4),
        sweep_seeds=(0,),
        eval_seeds=(100, 101, 102, 103),
        seeds_per_job=2,
    ),
}
LONGCTX_FIELDS = ("contexts", "train_windows", "eval_windows", "memory_probe")


def get_longctx_preset(name: str, **overrides: Any) -> LongContextConfig:
    """The long-context preset ``name`` with overrides, validated.

    ``contexts``, ``train_windows``, ``eval_windows`` and ``memory_probe`` replace the
    study's own fields; every other override goes to the bench template as in
    :func:`get_preset` (e.g. ``ranks=[16]``, ``eval_seeds=(100, 101)``,
    ``train={"epochs": 1}``).
    """
    if name not in LONGCTX_PRESETS:
        raise ValueError(f"preset must be one of {sorted(LONGCTX_PRESETS)}, got {name!r}")
    config = LONGCTX_PRESETS[name]
    own = {
        k: (tuple(v) if k == "contexts" else v) for k, v in overrides.items() if k in LONGCTX_FIELDS
    }
    bench = {k: v for k, v in overrides.items() if k not in LONGCTX_FIELDS}
    config = dataclasses.replace(config, **own)
    if bench:
        config = dataclasses.replace(config, bench=apply_overrides(config.bench, **bench))
    config.validate()
    return config
