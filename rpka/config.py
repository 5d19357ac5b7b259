"""The configuration of a study, apart from its named presets (``rpka.presets``).

Frozen dataclasses describe a study, from the data to the arms compared:

* a track's config - beside its track (``rpka.tracks.<track>``, e.g. ``TrackConfig``,
  ``LMConfig``); the model's - beside the model (``rpka.model.ModelConfig``);
* :class:`TrainConfig` - epochs, batch size, optimiser;
* :class:`ArmConfig` - one attention method with its options ("exact", "rpka-r16", ...),
  checked against ``rpka.attention``'s registry where it is built;
* :class:`MechanismConfig` - the mechanism study's options;
* :class:`BenchConfig` - all of the above plus learning rates and seeds;
* :class:`LongContextConfig` - one bench per context length.

Every dataclass is ``dataclasses.asdict``-able and round-trips through JSON
(``BenchConfig.from_dict(json.loads(json.dumps(asdict(cfg)))) == cfg``), so notebooks take
their parameters from it and run files record them. :func:`apply_overrides` replaces
fields of a config and validates the result. Every bad value raises ``ValueError`` naming
the parameter and its allowed range.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from rpka.attention import options_of
from rpka.attention.rpcholesky import PIVOT_RULES, weighting_power
from rpka.attention.rpka import PIVOT_SETS
from rpka.checks import is_int, is_number, require
from rpka.model import ModelConfig
from rpka.tracks import TRACKS, Task, get_task

DEVICES = ("cpu", "cuda")
LR_SCHEDULES = ("cosine", "constant")
MONTE_CARLO = ("auto", "replay", "resample")
CANDIDATE_DECREASES = ("package", "explicit")


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
            require(is_int(value) and value >= 1, f"train.{name}", ">= 1", value)
        require(
            len(self.betas) == 2 and all(is_number(b) and 0 <= b < 1 for b in self.betas),
            "train.betas",
            "two numbers in [0, 1)",
            self.betas,
        )
        require(is_number(self.eps) and self.eps > 0, "train.eps", "> 0", self.eps)
        require(
            self.lr_schedule in LR_SCHEDULES,
            "train.lr_schedule",
            f"one of {LR_SCHEDULES}",
            self.lr_schedule,
        )
        for name in ("weight_decay", "grad_clip"):
            value = getattr(self, name)
            require(is_number(value) and value >= 0, f"train.{name}", ">= 0", value)
        require(
            is_int(self.warmup_steps) and self.warmup_steps >= 0,
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
        require(isinstance(self.name, str) and self.name != "", "arm.name", "a name", self.name)
        try:
            valid = options_of(self.method)
        except ValueError as err:
            raise ValueError(f"arm {self.name!r}: {err}") from None
        unknown = sorted(set(self.options) - set(valid) - {"generator"})
        require(
            not unknown,
            f"arm {self.name!r} options",
            f"among {sorted(set(valid) - {'generator', 'causal', 'check_inputs'})}",
            unknown,
        )
        require(
            "generator" not in self.options,
            f"arm {self.name!r} options",
            "without a generator (the run seeds it)",
            sorted(self.options),
        )
        if "rank" in self.options:
            rank = self.options["rank"]
            require(is_int(rank) and rank >= 1, f"arm {self.name!r} rank", ">= 1", rank)
        if self.sweep_seeds is not None:
            require(
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


def local_arm(window: int, lr_from: str | None = None) -> ArmConfig:
    """The local-window control ``local-w<window>`` (``rpka.attention.local``: softmax over
    the last ``window`` keys, causal or not as the track's model is), on any track. It
    sweeps its own learning rate unless ``lr_from`` names the arm whose rate it takes - a
    control that failed for want of a tuned rate would show nothing."""
    require(is_int(window) and window >= 1, "window", "an integer >= 1", window)
    return ArmConfig(f"local-w{window}", "local", {"window": window}, lr_from=lr_from)


def peer_arm(method: str, rank: int, **options: Any) -> ArmConfig:
    """The arm ``<method>-r<rank>``: a peer method at rank (landmarks / features) ``rank``."""
    return ArmConfig(f"{method}-r{rank}", method, {"rank": rank, **options})


@dataclass(frozen=True)
class MechanismConfig:
    """Every option of the mechanism study; the defaults are the full study's.

    Attributes:
        rank: RPCholesky steps r of the trace-identity run (capped at N points).
        draws: independent one-step Monte Carlo draws per step.
        monte_carlo: ``"replay"`` (batched package runs replaying the prefix, the literal
            check), ``"resample"`` (the package's pivot sampler on the replayed state, same
            distribution, about (draws + N) / N times cheaper; see :func:`_package_draws`) or
            ``"auto"``: replay on a GPU, resample on the CPU (the output records which).
        candidate_decreases: the one-step decrease of every candidate pivot, for ``exact``
            (and ``resample``'s draws): ``"package"`` (forced-pivot package runs, checks the
            package's update at every candidate, cost O(N^2 t^2) per step), ``"explicit"``
            (``|R[:, s]|^2 / R_ss`` of the explicit residual, O(N^2); the package's update
            is then checked along the run only, ``max_rel_error_trace``).
        z_threshold: the per-step display rule: ``|z| <= z_threshold`` at every step of every
            head (``per_step_rule_met``); the decision is the pooled test over ``mc_seeds``.
        mc_seeds: independent Monte Carlo seeds (a fresh RPCholesky run and fresh draws
            each, seeds ``seed``, ``seed + 1``, ...); their z-scores are pooled
            (``rpka.stats.pooled_z``: chi-square of sum z^2 and Stouffer's sum z) to decide.
        pivot_set, weighting, tempering, den_floor: as :class:`RPKAttention`.
        quality_ranks: ranks of the approximation-quality study (each capped at N).
        quality_seeds: pivot seeds per rule and rank.
        rules: pivot rules compared.
        layers, heads: indices studied (``None``: all).
        identity_item: the batch item of the trace identity.
        quality_items: the first ``quality_items`` batch items (at most B) enter the quality
            study.
        seed: seeds every generator of the study.
        batch_budget_mb: memory bound of one batched Monte Carlo call (chunks the draws).
        optimum_floor: the ratio to the optimum is reported only where the optimal trace
            error exceeds ``optimum_floor * tr A`` (below it both are round-off).
    """

    rank: int = 64
    draws: int = 2000
    monte_carlo: str = "auto"
    candidate_decreases: str = "package"
    z_threshold: float = 4.0
    mc_seeds: int = 4
    pivot_set: str = "joint"
    weighting: str = "gauss"
    tempering: float = 0.5
    den_floor: float = 1e-6
    quality_ranks: tuple[int, ...] = (4, 8, 16, 32, 64, 128)
    quality_seeds: int = 20
    rules: tuple[str, ...] = PIVOT_RULES
    layers: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = None
    identity_item: int = 0
    quality_items: int = 1
    seed: int = 0
    batch_budget_mb: float = 512.0
    optimum_floor: float = 1e-9

    def validate(self) -> None:
        for name, low in (
            ("rank", 1),
            ("draws", 2),
            ("quality_seeds", 1),
            ("quality_items", 1),
            ("mc_seeds", 1),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if not isinstance(self.identity_item, int) or self.identity_item < 0:
            raise ValueError(f"identity_item must be an integer >= 0, got {self.identity_item!r}")
        if self.monte_carlo not in MONTE_CARLO:
            raise ValueError(f"monte_carlo must be one of {MONTE_CARLO}, got {self.monte_carlo!r}")
        if self.candidate_decreases not in CANDIDATE_DECREASES:
            raise ValueError(
                f"candidate_decreases must be one of {CANDIDATE_DECREASES}, "
                f"got {self.candidate_decreases!r}"
            )
        if not self.z_threshold > 0:
            raise ValueError(f"z_threshold must be > 0, got {self.z_threshold!r}")
        if self.pivot_set not in PIVOT_SETS:
            raise ValueError(f"pivot_set must be one of {PIVOT_SETS}, got {self.pivot_set!r}")
        weighting_power(self.weighting, self.tempering)  # validates both
        if not 0.0 < self.den_floor < 1.0:
            raise ValueError(f"den_floor must lie in (0, 1), got {self.den_floor!r}")
        if not self.quality_ranks or any(
            not isinstance(r, int) or isinstance(r, bool) or r < 1 for r in self.quality_ranks
        ):
            raise ValueError(f"quality_ranks must be positive integers, got {self.quality_ranks}")
        if not self.rules or any(rule not in PIVOT_RULES for rule in self.rules):
            raise ValueError(f"rules must be a non-empty subset of {PIVOT_RULES}, got {self.rules}")
        if not self.batch_budget_mb > 0:
            raise ValueError(f"batch_budget_mb must be > 0, got {self.batch_budget_mb!r}")
        if not 0.0 <= self.optimum_floor < 1.0:
            raise ValueError(f"optimum_floor must lie in [0, 1), got {self.optimum_floor!r}")

    def to_dict(self) -> dict[str, object]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class BenchConfig:
    """A whole study: track, model, training, arms, learning rates and seeds.

    ``track`` is the config of a track (its ``name`` picks the track's ``Task`` in
    ``rpka.tracks.TRACKS``); ``metric`` is one of that task's ``metrics``.
    sweep_seeds score every learning rate on validation; eval_seeds (disjoint from them)
    train the best learning rate of each arm and score it on test. ``primary_arm`` is the
    arm reported under ``idea`` / ``comparison``; ``baseline_arm`` is the reference.
    ``n_workers`` processes run jobs in parallel (1 = in this process);
    ``seeds_per_job`` seeds are stacked in one model per job (more seeds per job: less
    overhead; fewer: better load balance across workers).

    The decision rule (docs/statistics.md): ``primary_arm`` against the baseline is the one
    pre-registered comparison, unadjusted; every other arm but the control is the secondary
    family, Holm-adjusted; ``margin`` (metric units) is the TOST equivalence margin (None:
    no equivalence test, so no verdict "equivalent"). ``control_arm`` (None: the arm of
    method ``mean`` if there is one) is the attention gate's control: it must lose to the
    baseline by at least ``gate_min_rel`` of the baseline's mean (one-sided p < 0.05), or
    every verdict of the track reads "uninformative". ``local_control_arm`` (None: the arm
    of method ``local`` if there is one) is the local-window control (issue 27): outside
    the Holm family like the control; with ``gate_needs_local`` (the long-context studies)
    the gate passes only when the baseline beats both controls by that rule
    (``rpka.decision.verdict_gate``); without it the local control is reported beside the
    gate and does not change it.
    """

    preset: str
    track: Any  # the config of a track (``rpka.tracks.TRACKS[name].config_class``)
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
    # (rpka.quality.method_output_errors; non-causal forecast models); () skips the study
    output_error_ranks: tuple[int, ...] = ()
    margin: float | None = None
    control_arm: str | None = None
    gate_min_rel: float = 0.25
    local_control_arm: str | None = None
    gate_needs_local: bool = False
    # the arm exact by construction (the rank frontier's positive control, rpka.frontier):
    # read by the frontier rule, outside the Holm family like the attention gate's control
    positive_control_arm: str | None = None

    @property
    def control(self) -> str | None:
        """The attention gate's control arm: ``control_arm``, else the arm of method
        ``mean`` (attention replaced by the context mean), else None (no gate)."""
        if self.control_arm is not None:
            return self.control_arm
        return next((a.name for a in self.arms if a.method == "mean"), None)

    @property
    def local_control(self) -> str | None:
        """The local-window control arm: ``local_control_arm``, else the arm of method
        ``local`` (sliding-window attention), else None."""
        if self.local_control_arm is not None:
            return self.local_control_arm
        return next((a.name for a in self.arms if a.method == "local"), None)

    @property
    def secondary_arms(self) -> tuple[str, ...]:
        """The Holm family: every arm but the baseline, the primary and the controls (the
        attention gate's, the local window and the frontier's positive control)."""
        skip = {
            self.baseline_arm,
            self.primary_arm,
            self.control,
            self.local_control,
            self.positive_control_arm,
        }
        return tuple(a.name for a in self.arms if a.name not in skip)

    @property
    def track_name(self) -> str:
        """The name of ``self.track``: a key of ``rpka.tracks.TRACKS``."""
        return self.track.name

    @property
    def task(self) -> Task:
        """The track's :class:`~rpka.tracks.base.Task`."""
        return get_task(self.track.name)

    def validate(self) -> None:
        name = getattr(self.track, "name", None)
        require(name in TRACKS, "track.name", f"one of {sorted(TRACKS)}", name)
        require(
            isinstance(self.track, self.task.config_class),
            "track",
            f"a {self.task.config_class.__name__} (track {name!r})",
            type(self.track).__name__,
        )
        self.track.validate()
        self.model.validate()
        self.train.validate()
        require(len(self.arms) >= 1, "arms", "a non-empty list", self.arms)
        for arm in self.arms:
            arm.validate()
        self.task.validate_bench(self)
        names = [arm.name for arm in self.arms]
        require(len(set(names)) == len(names), "arms", "uniquely named", names)
        for arm in self.arms:
            extra = sorted(set(arm.sweep_seeds or ()) - set(self.sweep_seeds))
            require(not extra, f"arm {arm.name!r} sweep_seeds", "a subset of sweep_seeds", extra)
            if arm.lr_from is not None:
                sources = [a.name for a in self.arms if a.lr_from is None and a is not arm]
                require(
                    arm.lr_from in sources,
                    f"arm {arm.name!r} lr_from",
                    f"another arm that sweeps its own learning rate, one of {sources}",
                    arm.lr_from,
                )
        require(self.baseline_arm in names, "baseline_arm", f"one of {names}", self.baseline_arm)
        require(self.primary_arm in names, "primary_arm", f"one of {names}", self.primary_arm)
        require(
            self.primary_arm != self.baseline_arm,
            "primary_arm",
            f"an arm other than the baseline {self.baseline_arm!r}",
            self.primary_arm,
        )
        require(
            self.margin is None or (is_number(self.margin) and 0 < self.margin < math.inf),
            "margin",
            "a finite number > 0 (metric units) or None",
            self.margin,
        )
        require(
            self.control_arm is None
            or (
                self.control_arm in names
                and self.control_arm not in (self.baseline_arm, self.primary_arm)
            ),
            "control_arm",
            f"None or an arm other than the baseline and the primary, one of {names}",
            self.control_arm,
        )
        require(
            self.local_control_arm is None
            or (
                self.local_control_arm in names
                and self.arm(self.local_control_arm).method == "local"
                and self.local_control_arm not in (self.baseline_arm, self.primary_arm)
            ),
            "local_control_arm",
            f"None or an arm of method 'local' other than the baseline and the primary, one "
            f"of {names}",
            self.local_control_arm,
        )
        require(
            isinstance(self.gate_needs_local, bool)
            and (not self.gate_needs_local or self.local_control is not None),
            "gate_needs_local",
            "a bool, True only with a local control arm (an arm of method 'local')",
            self.gate_needs_local,
        )
        require(
            self.positive_control_arm is None
            or (
                self.positive_control_arm in names
                and self.positive_control_arm
                not in (self.baseline_arm, self.primary_arm, self.control)
            ),
            "positive_control_arm",
            f"None or an arm other than the baseline, the primary and the control, one of {names}",
            self.positive_control_arm,
        )
        require(
            is_number(self.gate_min_rel) and 0 <= self.gate_min_rel < math.inf,
            "gate_min_rel",
            "a finite number >= 0",
            self.gate_min_rel,
        )
        require(
            len(self.learning_rates) >= 1
            and all(is_number(lr) and 0 < lr for lr in self.learning_rates),
            "learning_rates",
            "positive numbers (at least one)",
            self.learning_rates,
        )
        require(
            len(set(self.learning_rates)) == len(self.learning_rates),
            "learning_rates",
            "distinct",
            self.learning_rates,
        )
        for name in ("sweep_seeds", "eval_seeds"):
            seeds = getattr(self, name)
            require(
                len(seeds) >= 1 and all(is_int(s) and s >= 0 for s in seeds),
                name,
                "non-negative integers (at least one)",
                seeds,
            )
            require(len(set(seeds)) == len(seeds), name, "distinct", seeds)
        if self.mechanism is not None:
            allowed = {f.name for f in fields(MechanismConfig)}
            bad = sorted(set(self.mechanism) - allowed)
            require(not bad, "mechanism", f"keys among {sorted(allowed)}", bad)
        if self.ablation_reference is None:
            require(
                not self.ablation_arms,
                "ablation_arms",
                "empty without an ablation_reference",
                self.ablation_arms,
            )
        else:
            require(
                self.ablation_reference in names,
                "ablation_reference",
                f"one of {names}",
                self.ablation_reference,
            )
            unknown = sorted(set(self.ablation_arms) - set(names))
            require(not unknown, "ablation_arms", f"arms among {names}", unknown)
            require(
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
            require(
                bool(shared),
                "ablation arms' sweep_seeds",
                "sharing at least one seed with the reference's (the choice compares them)",
                {a.name: a.sweep_seeds for a in candidates},
            )
        require(
            all(is_int(r) and r >= 1 for r in self.output_error_ranks)
            and (not self.output_error_ranks or not self.task.causal),
            "output_error_ranks",
            "positive integers (or empty; the study compares non-causal attention, on "
            "non-causal tracks only)",
            self.output_error_ranks,
        )
        shared = sorted(set(self.sweep_seeds) & set(self.eval_seeds))
        require(not shared, "eval_seeds", "disjoint from sweep_seeds", shared)
        metrics = self.task.metrics
        require(self.metric in metrics, "metric", f"one of {metrics} for this track", self.metric)
        require(self.device in DEVICES, "device", f"one of {DEVICES}", self.device)
        require(is_int(self.n_workers) and self.n_workers >= 1, "n_workers", ">= 1", self.n_workers)
        require(
            is_int(self.seeds_per_job) and self.seeds_per_job >= 1,
            "seeds_per_job",
            ">= 1",
            self.seeds_per_job,
        )

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
        require(not unknown, "BenchConfig keys", f"among {sorted(known)}", unknown)
        track = dict(data["track"])
        data["track"] = get_task(track.get("name")).config_class(**track)
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


def apply_overrides(config: BenchConfig, **overrides: Any) -> BenchConfig:
    """``config`` with overrides as :func:`get_preset` takes them, validated."""
    overrides = dict(overrides)
    ranks = overrides.pop("ranks", None)
    if ranks is not None:
        ranks = list(ranks)
        require(
            len(ranks) >= 1 and all(is_int(r) and r >= 1 for r in ranks),
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
    require(not unknown, "override", f"among {sorted(known | {'ranks'})}", unknown)
    nested = {"track": type(config.track), "model": ModelConfig, "train": TrainConfig}
    for key, value in list(overrides.items()):
        if key in nested and isinstance(value, Mapping):
            current = getattr(config, key)
            allowed = {f.name for f in fields(current)}
            bad = sorted(set(value) - allowed)
            require(not bad, f"{key} override", f"among {sorted(allowed)}", bad)
            overrides[key] = dataclasses.replace(current, **value)
        elif key in (*TUPLE_FIELDS, "arms"):
            overrides[key] = tuple(value)
    config = dataclasses.replace(config, **overrides)
    config.validate()
    return config


@dataclass(frozen=True)
class LongContextConfig:
    """Exact against RPKA when training at long context: one bench per context length.

    ``bench`` is the template every context shares - model, training, arms, learning
    rates, seeds, workers (its ``mechanism`` study is off: the long-context study measures
    cost and accuracy only). :meth:`bench_for` resizes the track to each context with the
    track's own ``Task.at_context``, so every context trains on the same number of windows,
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
        require(
            len(self.contexts) >= 1
            and all(is_int(c) and c >= 8 for c in self.contexts)
            and len(set(self.contexts)) == len(self.contexts),
            "contexts",
            "distinct integers >= 8 (at least one)",
            self.contexts,
        )
        require(isinstance(self.memory_probe, bool), "memory_probe", "a bool", self.memory_probe)
        for context in self.contexts:
            self.bench_for(context)  # validates the sized track and the whole bench

    def bench_for(self, context: int) -> BenchConfig:
        """The bench at ``context`` (validated)."""
        track = self.bench.task.at_context(
            self.bench.track, context, self.train_windows, self.eval_windows
        )
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


__all__ = ["ModelConfig"]  # re-exported: the model's config, beside the model
