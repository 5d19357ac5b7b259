"""The parts a study is assembled from (``rpka.config.bench`` assembles them): the training
(:class:`TrainConfig`), one arm of the comparison (:class:`ArmConfig`, built by
:func:`rpka_arm`, :func:`local_arm`, :func:`peer_arm`) and the mechanism study's options
(:class:`MechanismConfig`). Each validates itself; every bad value raises ``ValueError``
naming the parameter and its allowed range.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rpka.attention import options_of
from rpka.attention.rpcholesky import PIVOT_RULES, weighting_power
from rpka.attention.rpka import PIVOT_SETS
from rpka.checks import is_int, is_number, require

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
            (``rpka.verdict.stats.pooled_z``: chi-square of sum z^2 and Stouffer's sum z) to decide.
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
