"""The four concerns of a study (``rpka.config.bench.BenchConfig`` composes them), each a frozen
dataclass that validates itself before any work starts, naming the parameter and its
allowed range: :class:`Design` (what is compared), :class:`DecisionRule` (how it is
decided), :class:`Studies` (the studies beside the comparison) and :class:`Execution`
(where the runs go). The rule and the studies name arms, so they validate against the
design.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from rpka.checks import is_int, is_number, require
from rpka.config.parts import ArmConfig, MechanismConfig, TrainConfig
from rpka.model import ModelConfig
from rpka.tracks import TRACKS, Task, get_task

DEVICES = ("cpu", "cuda")
# the attention gate: the control must lose to the baseline by at least this share of its mean
GATE_MIN_REL = 0.25


@dataclass(frozen=True)
class Design:
    """What a study compares: ``track`` (the config of a track; its ``name`` picks the
    track's ``Task`` in ``rpka.tracks.TRACKS``), the model, the training, the arms, the
    learning rates each arm sweeps and the seeds. ``sweep_seeds`` score every learning
    rate on validation; ``eval_seeds`` (disjoint from them) train the best learning rate
    of each arm and score it on test. ``metric`` is one of the task's ``metrics``.
    ``warm_start_track`` (None: none): the same track at a shorter context, where every run
    trains first (``rpka.training.curriculum``; the long-range study's curriculum).
    ``data_per_seed``: each seed trains and is scored on its own draw of the track, from a
    data seed derived from it (``rpka.training.seed_data``; generated tracks only); off, every run
    reads the track as configured."""

    track: Any  # the config of a track (``rpka.tracks.TRACKS[name].config_class``)
    model: ModelConfig
    train: TrainConfig
    arms: tuple[ArmConfig, ...]
    learning_rates: tuple[float, ...] = (1e-3, 3e-3, 1e-2)
    sweep_seeds: tuple[int, ...] = (0, 1)
    eval_seeds: tuple[int, ...] = tuple(range(100, 108))
    metric: str = "mse"
    warm_start_track: Any = None
    data_per_seed: bool = False

    @property
    def task(self) -> Task:
        """The track's :class:`~rpka.tracks.base.Task`."""
        return get_task(self.track.name)

    @property
    def arm_names(self) -> list[str]:
        return [arm.name for arm in self.arms]

    def arm(self, name: str) -> ArmConfig:
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise ValueError(f"no arm named {name!r}; arms: {self.arm_names}")

    def validate(self) -> None:
        self._validate_parts()
        self._validate_arms()
        self._validate_grid()

    def _validate_parts(self) -> None:
        """The track (a registered one, of its task's config class), model and training."""
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
        if self.warm_start_track is not None:
            self._validate_warm_start()
        require(isinstance(self.data_per_seed, bool), "data_per_seed", "a bool", self.data_per_seed)
        require(
            not self.data_per_seed or "seed" in {f.name for f in fields(self.track)},
            "data_per_seed",
            "False on a track without a 'seed' field (a data set per seed needs a generator)",
            self.data_per_seed,
        )

    def _validate_warm_start(self) -> None:
        """The same track at a shorter context, a model whose weights but the learned
        positions do not depend on the length (``rpka.training.curriculum.stretched_state``)."""
        warm, cls = self.warm_start_track, self.task.config_class
        require(
            isinstance(warm, cls) and warm.name == self.track.name,
            "warm_start_track",
            f"a {cls.__name__} of track {self.track.name!r}",
            warm,
        )
        warm.validate()
        context = getattr(self.track, "context", None)
        require(
            context is not None and warm.context < context,
            "warm_start_track.context",
            f"< the track's context {context}",
            warm.context,
        )
        require(
            self.model.readout == "last" and not self.model.linear_skip,
            "model",
            "readout 'last' and linear_skip off with a warm start (weights independent of the "
            "length)",
            f"readout {self.model.readout!r}, linear_skip {self.model.linear_skip}",
        )

    def _validate_arms(self) -> None:
        """Every arm valid and runnable on the track, uniquely named, its sweep seeds among
        the study's and its borrowed learning rate from an arm that sweeps its own."""
        require(len(self.arms) >= 1, "arms", "a non-empty list", self.arms)
        for arm in self.arms:
            arm.validate()
        self.task.validate_bench(self)
        names = self.arm_names
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

    def _validate_grid(self) -> None:
        """Learning rates, the two disjoint seed sets and the metric."""
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
        shared = sorted(set(self.sweep_seeds) & set(self.eval_seeds))
        require(not shared, "eval_seeds", "disjoint from sweep_seeds", shared)
        metrics = self.task.metrics
        require(self.metric in metrics, "metric", f"one of {metrics} for this track", self.metric)


@dataclass(frozen=True)
class DecisionRule:
    """How a study's comparison is decided (docs/statistics.md).

    ``primary_arm`` against ``baseline_arm`` is the one pre-registered comparison,
    unadjusted (the arm reported under ``idea`` / ``comparison``); every other arm but the
    controls is the secondary family, Holm-adjusted; ``margin`` (metric units) is the TOST
    equivalence margin (None: no equivalence test, so no verdict "equivalent").
    ``control_arm`` (None: the arm of method ``mean`` if there is one) is the attention
    gate's control: it must lose to the baseline by at least ``gate_min_rel`` of the
    baseline's mean (one-sided p < alpha), or every verdict of the track reads
    "uninformative". ``local_control_arm`` (None: the arm of method ``local`` if there is
    one) is the local-window control (issue 27): outside the Holm family like the control;
    with ``gate_needs_local`` (the long-context studies) the gate passes only when the
    baseline beats both controls by that rule (``rpka.verdict.decision.verdict_gate``); without it
    the local control is reported beside the gate and does not change it.
    ``positive_control_arm`` is the arm exact by construction (the rank frontier's positive
    control, ``rpka.verdict.frontier``): read by the frontier rule, outside the Holm family too.
    """

    primary_arm: str
    baseline_arm: str = "exact"
    margin: float | None = None
    control_arm: str | None = None
    gate_min_rel: float = GATE_MIN_REL
    local_control_arm: str | None = None
    gate_needs_local: bool = False
    positive_control_arm: str | None = None

    def control(self, design: Design) -> str | None:
        """The attention gate's control arm: ``control_arm``, else the arm of method
        ``mean`` (attention replaced by the context mean), else None (no gate)."""
        if self.control_arm is not None:
            return self.control_arm
        return next((a.name for a in design.arms if a.method == "mean"), None)

    def local_control(self, design: Design) -> str | None:
        """The local-window control arm: ``local_control_arm``, else the arm of method
        ``local`` (sliding-window attention), else None."""
        if self.local_control_arm is not None:
            return self.local_control_arm
        return next((a.name for a in design.arms if a.method == "local"), None)

    def secondary_arms(self, design: Design) -> tuple[str, ...]:
        """The Holm family: every arm but the baseline, the primary and the controls (the
        attention gate's, the local window and the frontier's positive control)."""
        skip = {
            self.baseline_arm,
            self.primary_arm,
            self.control(design),
            self.local_control(design),
            self.positive_control_arm,
        }
        return tuple(a.name for a in design.arms if a.name not in skip)

    def validate(self, design: Design) -> None:
        names = design.arm_names
        self._validate_comparison(names)
        self._validate_controls(design, names)

    def _validate_comparison(self, names: list[str]) -> None:
        """The primary and the baseline: two different arms; the margin."""
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

    def _validate_controls(self, design: Design, names: list[str]) -> None:
        """The gate's controls and the positive control: arms outside the comparison."""
        compared = (self.baseline_arm, self.primary_arm)
        require(
            self.control_arm is None
            or (self.control_arm in names and self.control_arm not in compared),
            "control_arm",
            f"None or an arm other than the baseline and the primary, one of {names}",
            self.control_arm,
        )
        local = self.local_control_arm
        require(
            local is None
            or (local in names and design.arm(local).method == "local" and local not in compared),
            "local_control_arm",
            f"None or an arm of method 'local' other than the baseline and the primary, one "
            f"of {names}",
            local,
        )
        require(
            isinstance(self.gate_needs_local, bool)
            and (not self.gate_needs_local or self.local_control(design) is not None),
            "gate_needs_local",
            "a bool, True only with a local control arm (an arm of method 'local')",
            self.gate_needs_local,
        )
        positive = self.positive_control_arm
        require(
            positive is None
            or (positive in names and positive not in (*compared, self.control(design))),
            "positive_control_arm",
            f"None or an arm other than the baseline, the primary and the control, one of {names}",
            positive,
        )
        require(
            is_number(self.gate_min_rel) and 0 <= self.gate_min_rel < math.inf,
            "gate_min_rel",
            "a finite number >= 0",
            self.gate_min_rel,
        )


@dataclass(frozen=True)
class Studies:
    """The studies beside the comparison, on the trained models.

    ``mechanism``: overrides of :class:`MechanismConfig` for the study of the primary arm's
    trained model (empty: the full study's defaults); None skips the study.
    ``ablation_reference``, ``ablation_arms``: RPKA's default is chosen on validation among
    the reference (the current default configuration) and the ablation arms (alternatives,
    one choice changed each); None: no choice.
    ``output_error_ranks``: ranks at which every arm's attention is compared with exact on
    its trained Q/K (``rpka.kernel.quality.method_output_errors``; non-causal forecast models);
    () skips the study.
    """

    mechanism: dict[str, Any] | None = field(default_factory=dict)
    ablation_reference: str | None = None
    ablation_arms: tuple[str, ...] = ()
    output_error_ranks: tuple[int, ...] = ()

    def validate(self, design: Design) -> None:
        if self.mechanism is not None:
            allowed = {f.name for f in fields(MechanismConfig)}
            bad = sorted(set(self.mechanism) - allowed)
            require(not bad, "mechanism", f"keys among {sorted(allowed)}", bad)
        self._validate_ablations(design)
        require(
            all(is_int(r) and r >= 1 for r in self.output_error_ranks)
            and (not self.output_error_ranks or not design.task.causal),
            "output_error_ranks",
            "positive integers (or empty; the study compares non-causal attention, on "
            "non-causal tracks only)",
            self.output_error_ranks,
        )

    def _validate_ablations(self, design: Design) -> None:
        """The ablation choice: arms of the study, distinct, sharing a sweep seed."""
        names = design.arm_names
        if self.ablation_reference is None:
            require(
                not self.ablation_arms,
                "ablation_arms",
                "empty without an ablation_reference",
                self.ablation_arms,
            )
            return
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
        candidates = [design.arm(n) for n in (self.ablation_reference, *self.ablation_arms)]
        shared = set(design.sweep_seeds).intersection(
            *(set(a.sweep_seeds or design.sweep_seeds) for a in candidates)
        )
        require(
            bool(shared),
            "ablation arms' sweep_seeds",
            "sharing at least one seed with the reference's (the choice compares them)",
            {a.name: a.sweep_seeds for a in candidates},
        )


@dataclass(frozen=True)
class Execution:
    """Where a study's runs go: ``n_workers`` processes run jobs in parallel (1 = in this
    process); ``seeds_per_job`` seeds are stacked in one model per job (more seeds per job:
    less overhead; fewer: better load balance across workers)."""

    device: str = "cpu"
    n_workers: int = 2
    seeds_per_job: int = 4

    def validate(self) -> None:
        require(self.device in DEVICES, "device", f"one of {DEVICES}", self.device)
        require(is_int(self.n_workers) and self.n_workers >= 1, "n_workers", ">= 1", self.n_workers)
        require(
            is_int(self.seeds_per_job) and self.seeds_per_job >= 1,
            "seeds_per_job",
            ">= 1",
            self.seeds_per_job,
        )
