"""The configuration of a study, apart from its named presets (``rpka.config.presets``).

A study, :class:`BenchConfig`, is its preset's name and four concerns
(``rpka.config.concerns``, re-exported here), each a frozen dataclass that validates
itself before any work starts:

* :class:`Design` - what is compared: the track, model, training, arms, learning rates,
  seeds and metric;
* :class:`DecisionRule` - how the comparison is decided: the primary arm against the
  baseline, the equivalence margin and the attention gate's controls (docs/statistics.md);
* :class:`Studies` - the studies beside the comparison: the mechanism check, RPKA's
  ablation choice and the output errors;
* :class:`Execution` - where the runs go: device, workers, seeds per job.

The parts they hold: a track's config beside its track (``rpka.tracks.<track>``), the
model's beside the model (``rpka.model.ModelConfig``), and :class:`TrainConfig`,
:class:`ArmConfig` and :class:`MechanismConfig` in ``rpka.config.parts`` (re-exported
here). :class:`LongContextConfig` is one bench per context length.

On disk (``bench_report.json``, run files, notebooks' parameters) a study is one flat
mapping of every concern's fields, in :data:`FLAT_FIELDS` order: :meth:`BenchConfig.to_dict`
writes it, :meth:`BenchConfig.from_dict` reads it (also after a JSON round trip),
:meth:`BenchConfig.of` builds a study from those names and :meth:`BenchConfig.replace`
changes some. In code a field is read on its concern (``config.decision.margin``,
``config.design.eval_seeds``): one name per field. :func:`apply_overrides` replaces fields
of a config and validates the result. Every bad value raises ``ValueError`` naming the
parameter and its allowed range.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from rpka.checks import is_int, require
from rpka.config.concerns import DEVICES, DecisionRule, Design, Execution, Studies
from rpka.config.parts import (
    ArmConfig,
    MechanismConfig,
    TrainConfig,
    local_arm,
    peer_arm,
    rpka_arm,
)
from rpka.model import ModelConfig
from rpka.tracks import Task, get_task
from rpka.tracks.cache import track_fields

# the concerns of a study, by their field in BenchConfig
CONCERNS: dict[str, type] = {
    "design": Design,
    "decision": DecisionRule,
    "studies": Studies,
    "execution": Execution,
}
# the on-disk form of a study (bench_report.json's "config", notebooks' parameters): every
# concern's fields in one flat mapping, in the order the single dataclass it replaced wrote
# them - run files and committed reports keep their bytes
FLAT_FIELDS: tuple[str, ...] = (
    "preset",
    "track",
    "model",
    "train",
    "arms",
    "primary_arm",
    "baseline_arm",
    "learning_rates",
    "sweep_seeds",
    "eval_seeds",
    "metric",
    "warm_start_track",
    "data_per_seed",
    "device",
    "n_workers",
    "seeds_per_job",
    "mechanism",
    "ablation_reference",
    "ablation_arms",
    "output_error_ranks",
    "margin",
    "control_arm",
    "gate_min_rel",
    "local_control_arm",
    "gate_needs_local",
    "positive_control_arm",
)
# the flat fields held as tuples (JSON turns them into lists)
TUPLE_FIELDS = (
    "learning_rates",
    "sweep_seeds",
    "eval_seeds",
    "ablation_arms",
    "output_error_ranks",
)


@dataclass(frozen=True)
class BenchConfig:
    """A whole study: its preset's name and its four concerns (module docstring).

    A field reads on its concern (``config.design.eval_seeds``,
    ``config.decision.primary_arm``); :meth:`of` and :meth:`replace` take the flat names
    (:data:`FLAT_FIELDS`), the presets' and the JSON's interface.
    """

    preset: str
    design: Design
    decision: DecisionRule
    studies: Studies = field(default_factory=Studies)
    execution: Execution = field(default_factory=Execution)

    @property
    def control(self) -> str | None:
        """The attention gate's control arm (:meth:`DecisionRule.control`)."""
        return self.decision.control(self.design)

    @property
    def local_control(self) -> str | None:
        """The local-window control arm (:meth:`DecisionRule.local_control`)."""
        return self.decision.local_control(self.design)

    @property
    def secondary_arms(self) -> tuple[str, ...]:
        """The Holm family (:meth:`DecisionRule.secondary_arms`)."""
        return self.decision.secondary_arms(self.design)

    @property
    def track_name(self) -> str:
        """The name of ``self.track``: a key of ``rpka.tracks.TRACKS``."""
        return self.design.track.name

    @property
    def task(self) -> Task:
        """The track's :class:`~rpka.tracks.base.Task`."""
        return self.design.task

    def arm(self, name: str) -> ArmConfig:
        return self.design.arm(name)

    def validate(self) -> None:
        """Each concern in turn: the design first (the others name its arms)."""
        self.design.validate()
        self.decision.validate(self.design)
        self.studies.validate(self.design)
        self.execution.validate()

    @classmethod
    def of(cls, **flat: Any) -> BenchConfig:
        """A study from the flat names of its fields (:data:`FLAT_FIELDS`), not validated."""
        unknown = sorted(set(flat) - set(FLAT_FIELDS))
        require(not unknown, "BenchConfig keys", f"among {sorted(FLAT_FIELDS)}", unknown)
        parts = {
            name: concern(**{f.name: flat[f.name] for f in fields(concern) if f.name in flat})
            for name, concern in CONCERNS.items()
        }
        return cls(preset=flat["preset"], **parts)

    def replace(self, **changes: Any) -> BenchConfig:
        """This study with flat fields replaced (as ``dataclasses.replace``), not validated."""
        return BenchConfig.of(**(self._flat() | changes))

    def _flat(self) -> dict[str, Any]:
        """Every field by its flat name, in :data:`FLAT_FIELDS` order (values as they are)."""
        values = {"preset": self.preset}
        for name in CONCERNS:
            part = getattr(self, name)
            values |= {f.name: getattr(part, f.name) for f in fields(part)}
        return {name: values[name] for name in FLAT_FIELDS}

    def to_dict(self) -> dict[str, Any]:
        """The on-disk form: one flat mapping, nested dataclasses as dicts (``asdict``)."""
        values = {"preset": self.preset}
        for name in CONCERNS:
            values |= dataclasses.asdict(getattr(self, name))
        # tracks store their fields as run ids hash them (later knobs at default left out)
        values["track"] = track_fields(self.design.track)
        if self.design.warm_start_track is not None:
            values["warm_start_track"] = track_fields(self.design.warm_start_track)
        return {name: values[name] for name in FLAT_FIELDS}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BenchConfig:
        """Inverse of :meth:`to_dict` (also after a JSON round trip)."""
        data = dict(data)
        unknown = sorted(set(data) - set(FLAT_FIELDS))
        require(not unknown, "BenchConfig keys", f"among {sorted(FLAT_FIELDS)}", unknown)
        track = dict(data["track"])
        config_class = get_task(track.get("name")).config_class
        data["track"] = config_class(**track)
        if data.get("warm_start_track") is not None:
            data["warm_start_track"] = config_class(**data["warm_start_track"])
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
        return cls.of(**data)


def _tuple_or_none(value: Any) -> tuple | None:
    return None if value is None else tuple(value)


def _rank_sweep(config: BenchConfig, ranks: Any, reference: str | None) -> tuple[ArmConfig, ...]:
    """``config``'s arms with the rank sweep (the arms ``rpka-r<rank>``) replaced by
    ``ranks``: a requested rank keeps its arm, a new one takes the sweep's RPKA options;
    ``reference`` (the ablations' reference) and the positive control stay."""
    ranks = list(ranks)
    require(
        len(ranks) >= 1 and all(is_int(r) and r >= 1 for r in ranks),
        "ranks",
        "positive integers (at least one)",
        ranks,
    )
    swept = [
        a
        for a in config.design.arms
        if a.method == "rpka" and a.name == f"rpka-r{a.options.get('rank')}"
    ]
    shared = {k: v for k, v in (swept[0].options if swept else {}).items() if k != "rank"}
    kept_anyway = {reference, config.decision.positive_control_arm}
    wanted = {f"rpka-r{r}" for r in ranks} | kept_anyway  # swept arms kept as they are
    dropped = {a.name for a in swept} - wanted
    others = [a for a in config.design.arms if a.name not in dropped]
    kept = {a.name for a in others}
    new_arms = [rpka_arm(r, **shared) for r in sorted(set(ranks)) if f"rpka-r{r}" not in kept]
    return tuple(others) + tuple(new_arms)


def apply_overrides(config: BenchConfig, **overrides: Any) -> BenchConfig:
    """``config`` with overrides as :func:`get_preset` takes them, validated."""
    overrides = dict(overrides)
    ranks = overrides.pop("ranks", None)
    if ranks is not None:
        ranks = list(ranks)
        reference = overrides.get("ablation_reference", config.studies.ablation_reference)
        overrides["arms"] = _rank_sweep(config, ranks, reference)
        overrides.setdefault("primary_arm", f"rpka-r{max(ranks)}")
    unknown = sorted(set(overrides) - set(FLAT_FIELDS))
    require(not unknown, "override", f"among {sorted({*FLAT_FIELDS, 'ranks'})}", unknown)
    nested = {"track": type(config.design.track), "model": ModelConfig, "train": TrainConfig}
    for key, value in list(overrides.items()):
        if key in nested and isinstance(value, Mapping):
            current = getattr(config.design, key)
            allowed = {f.name for f in fields(current)}
            bad = sorted(set(value) - allowed)
            require(not bad, f"{key} override", f"among {sorted(allowed)}", bad)
            overrides[key] = dataclasses.replace(current, **value)
        elif key in (*TUPLE_FIELDS, "arms"):
            overrides[key] = tuple(value)
    config = config.replace(**overrides)
    config.validate()
    return config


# The contexts a long-context study may train at. Exact attention's time grows as the
# square of the context: at 1,000,000 tokens one memory probe of the smoke preset spun for
# minutes in a single operator, which no signal interrupts (issue 43). 16,384 is 8 times
# the longest context of the studies (2,048), 64 times its attention's cost.
LONG_CONTEXT_RANGE = (8, 16_384)


@dataclass(frozen=True)
class LongContextConfig:
    """Exact against RPKA when training at long context: one bench per context length.

    ``bench`` is the template every context shares - model, training, arms, learning
    rates, seeds, workers (its ``mechanism`` study is off: the long-context study measures
    cost and accuracy only). :meth:`bench_for` resizes the track to each context with the
    track's own ``Task.at_context``, so every context trains on the same number of windows,
    hence the same number of steps. ``memory_probe`` measures the peak memory of one
    training step of every arm (``rpka.study.longctx.training_step_peak_mib``). With
    ``warm_start_from`` every context above it is a curriculum: each run first trains at
    ``warm_start_from`` tokens (the same arm, rate, seeds and steps), then at its own context
    from those weights (``rpka.training.curriculum``).
    """

    preset: str
    contexts: tuple[int, ...]
    bench: BenchConfig
    train_windows: int
    eval_windows: int
    memory_probe: bool = True
    warm_start_from: int | None = None

    def validate(self) -> None:
        low, high = LONG_CONTEXT_RANGE
        require(
            len(self.contexts) >= 1
            and all(is_int(c) and low <= c <= high for c in self.contexts)
            and len(set(self.contexts)) == len(self.contexts),
            "contexts",
            f"distinct integers in [{low}, {high}] (at least one)",
            self.contexts,
        )
        require(isinstance(self.memory_probe, bool), "memory_probe", "a bool", self.memory_probe)
        warm = self.warm_start_from
        require(
            warm is None or (is_int(warm) and low <= warm < max(self.contexts)),
            "warm_start_from",
            f"None or an integer in [{low}, {max(self.contexts) - 1}], below the longest "
            f"of the contexts {list(self.contexts)} (a context above it trains there first)",
            warm,
        )
        for context in self.contexts:
            self.bench_for(context)  # validates the sized track and the whole bench

    def bench_for(self, context: int) -> BenchConfig:
        """The bench at ``context`` (validated); above ``warm_start_from`` its runs train
        at that context first (``Design.warm_start_track``, ``rpka.training.curriculum``)."""
        task, windows = self.bench.task, (self.train_windows, self.eval_windows)
        track = task.at_context(self.bench.design.track, context, *windows)
        warm = self.warm_start_from
        warm_track = task.at_context(track, warm, *windows) if warm and context > warm else None
        config = self.bench.replace(track=track, warm_start_track=warm_track)
        config.validate()
        return config

    def to_dict(self) -> dict[str, Any]:
        """The on-disk form: the study's fields, the template as its flat mapping."""
        return {
            f.name: self.bench.to_dict() if f.name == "bench" else getattr(self, f.name)
            for f in fields(self)
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LongContextConfig:
        """Inverse of ``dataclasses.asdict`` (also after a JSON round trip)."""
        data = dict(data)
        data["bench"] = BenchConfig.from_dict(data["bench"])
        data["contexts"] = tuple(data["contexts"])
        return cls(**data)


__all__ = [  # with the parts re-exported: the model's config and rpka.config.parts'
    "DEVICES",
    "CONCERNS",
    "FLAT_FIELDS",
    "ArmConfig",
    "BenchConfig",
    "DecisionRule",
    "Design",
    "Execution",
    "LongContextConfig",
    "MechanismConfig",
    "ModelConfig",
    "Studies",
    "TrainConfig",
    "apply_overrides",
    "local_arm",
    "peer_arm",
    "rpka_arm",
]
