"""The long-context studies (``python -m rpka longctx``): ``LONGCTX_PRESETS`` and
:func:`get_longctx_preset`; one bench per context length, every context sharing the
template ``BenchConfig`` of its preset (``rpka.study.longctx``). How each size was chosen (what
was measured, when): docs/presets.md, "long context" and "long range"; docs/longctx.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rpka.checks import require
from rpka.config.bench import (
    ArmConfig,
    BenchConfig,
    LongContextConfig,
    TrainConfig,
    apply_overrides,
    local_arm,
    peer_arm,
    rpka_arm,
)
from rpka.config.presets_tracks import EXACT, FORECAST_MARGIN, MEAN_CONTROL, QUICK_EVAL_SEEDS
from rpka.model import ModelConfig
from rpka.tracks.lookup import LookupConfig
from rpka.tracks.regimes import RegimesConfig

# --------------------------------------------------------------------------- long context
# The long-context training study (issues 6 and 14; ``rpka.study.longctx``): one bench per
# context length, every context sharing the template ``BenchConfig`` of its preset, the
# track resized to each context by ``Task.at_context``.


# RPKA's proposal refresh at long context (issue 16, docs/speed.md): by L^{-1} and matrix
# products instead of a triangular solve against every point - the same pivot law, faster
# where the refresh dominates a training step
LONGCTX_RESIDUAL_SOLVE = "inverse"


def long_preset(
    preset: str,
    contexts: tuple[int, ...],
    train_windows: int,
    eval_windows: int,
    track: Any,
    arms: tuple[ArmConfig, ...],
    warm_start_from: int | None = None,
    **bench: Any,
) -> LongContextConfig:
    """A long-context preset of ``arms`` on ``track``, resized to each context (each above
    ``warm_start_from`` trained there first); ``bench`` sets the template's other fields."""
    template = BenchConfig.of(
        preset=f"longctx-{preset}",
        track=track,
        arms=arms,
        mechanism=None,
        margin=FORECAST_MARGIN,
        **bench,
    )
    template = template.replace(
        track=template.task.at_context(track, contexts[0], train_windows, eval_windows),
    )
    config = LongContextConfig(
        preset, contexts, template, train_windows, eval_windows, warm_start_from=warm_start_from
    )
    config.validate()
    return config


def _longctx(
    preset: str,
    contexts: tuple[int, ...],
    train_windows: int,
    eval_windows: int,
    track: Any,
    ranks: tuple[int, ...],
    **bench: Any,
) -> LongContextConfig:
    """A long-context preset: exact, RPKA at ``ranks`` and the control on ``track``, resized
    to each context; ``bench`` sets the template's other fields."""
    arms = (
        EXACT,
        *(rpka_arm(r, residual_solve=LONGCTX_RESIDUAL_SOLVE) for r in ranks),
        MEAN_CONTROL,
    )
    return long_preset(preset, contexts, train_windows, eval_windows, track, arms, **bench)


# The long-context form of forecast-regimes (issue 14): the regime the window returns to
# recurs all over the context, so the forecast reads on from any earlier occurrence at the
# right phase - attention over the whole context, the same task at every length. The model
# reads the forecast off the last token, whose input window of 17 steps holds the cue.
LONGCTX_TRACK = RegimesConfig(n_regimes=3, period_min=7, period_max=10)
LONGCTX_MODEL = ModelConfig(
    d_model=32,
    n_layers=1,
    n_heads=2,
    d_ff=64,
    embed_kernel=17,
    head_init_std=0.0,
    linear_skip=False,
    readout="last",
)
LONGCTX_TRAIN = TrainConfig(epochs=1, batch_size=16, warmup_steps=2)
# everything but the contexts, shared by full (512 and 2,048) and, cut down, quick (256)
REGIMES_STUDY: dict[str, Any] = {
    "train_windows": 4000,
    "eval_windows": 256,
    "track": LONGCTX_TRACK,
    "ranks": (16, 64),
    "model": LONGCTX_MODEL,
    "train": LONGCTX_TRAIN,
    "primary_arm": "rpka-r64",  # the main study's primary arm
    "learning_rates": (1e-2,),
    "sweep_seeds": (0,),
    # 6 seeds: the one-sided gate's sign-flip p can reach 1/64, the primary's two-sided 1/32
    "eval_seeds": tuple(range(100, 106)),
    "seeds_per_job": 3,
}
LONGCTX_PRESETS: dict[str, LongContextConfig] = {
    # the study's structure in seconds (tests)
    "smoke": _longctx(
        "smoke",
        contexts=(80, 96),
        train_windows=16,
        eval_windows=8,
        track=LONGCTX_TRACK,
        ranks=(4, 8),
        model=dataclasses.replace(LONGCTX_MODEL, d_model=8, n_heads=1, d_ff=16),
        train=TrainConfig(epochs=1, batch_size=8, warmup_steps=0),
        primary_arm="rpka-r8",
        learning_rates=(1e-2,),
        sweep_seeds=(0,),
        eval_seeds=(100, 101),
        n_workers=1,
        seeds_per_job=2,
    ),
    # a preview (issue 16's few minutes): the study's arms at 256 tokens on 256 of its
    # 4,000 training windows, the preview's 2 evaluation seeds
    "quick": _longctx(
        "quick",
        contexts=(256,),
        **(
            REGIMES_STUDY
            | {"train_windows": 256, "eval_windows": 128}
            | {"eval_seeds": QUICK_EVAL_SEEDS, "seeds_per_job": 2}
        ),
    ),
    # both lengths; rpka-r128 left out (its step is slower than exact's at 2,048 tokens)
    "full": _longctx("full", contexts=(512, 2048), **REGIMES_STUDY),
}

# --------------------------------------------------------------------------- long range
# Issue 27: a task whose answer lies far back (forecast-lookup: cue-payload pairs anywhere
# but in the context's last min_distance steps, the query cue at the end), the local window
# as a second control and the two-control gate (DecisionRule.gate_needs_local): the verdicts
# count only where exact beats both mean-attention and local-w128 by >= 25 % (one-sided
# p < 0.05).
LOCAL_WINDOW = 128  # the local control's window at long context (issue 27)
# The methods the long-range study's answer reads n* for (issue 40,
# rpka.verdict.robustness.longrange_answer): RPKA against uniform landmarks, the question
# the study asks - a design choice of the study, not metadata of the methods
ANSWER_METHODS = ("rpka", "nystrom-uniform")
# One pair (a fixed cue, a fresh payload) occurring 8 times, the fewest that learned; no pair
# within the local window plus the embedding's reach on both sides, so a band of 128 tokens
# ending at the last one reaches no payload step (lookup module docstring)
LONGRANGE_TRACK = LookupConfig(
    n_pairs=1,
    n_cues=1,
    n_copies=8,
    min_distance=LOCAL_WINDOW + 2 * (LONGCTX_MODEL.embed_kernel // 2),
)


def _longrange(
    preset: str,
    contexts: tuple[int, ...],
    train_windows: int,
    eval_windows: int,
    ranks: tuple[int, ...],
    peers: tuple[ArmConfig, ...],
    window: int = LOCAL_WINDOW,
    track: LookupConfig = LONGRANGE_TRACK,
    warm_start_from: int | None = None,
    **bench: Any,
) -> LongContextConfig:
    """A long-range preset on ``forecast-lookup``: exact, RPKA at ``ranks``, the ``peers``
    (e.g. ``nystrom-uniform-r64``), and both controls (mean-attention, ``local-w<window>``)
    under the two-control gate, every context above ``warm_start_from`` trained there
    first; ``bench`` sets the template's other fields (model, train, seeds, ...)."""
    arms: tuple[ArmConfig, ...] = (
        EXACT,
        *(rpka_arm(r, residual_solve=LONGCTX_RESIDUAL_SOLVE) for r in ranks),
        *peers,
        MEAN_CONTROL,
        local_arm(window),
    )
    return long_preset(
        preset, contexts, train_windows, eval_windows, track, arms, warm_start_from,
        gate_needs_local=True, **bench,
    )  # fmt: skip


# r128 is an extension over the budget: `--ranks 16 64 128` resumes every finished run
# and trains only r128
LONGRANGE_RANKS = (16, 64)
LONGRANGE_TRAIN = TrainConfig(epochs=1, batch_size=8, warmup_steps=2)
# The curriculum (docs/longctx.md): every run above 512 tokens trains the same 500 steps at
# 512 first (where exact learns the lookup) and then 500 at its own context, its positions
# stretched; cold, exact stayed at the naive forecast at 2,048 tokens and learned on some
# seeds only at 1,024
LONGRANGE_WARM_START = 512
LONGRANGE_CONTEXTS = (512, 1024, 2048)
# The positive control: a rank >= the 2n joint points at every length of the study (RPKA is
# softmax attention there by Nystrom's identity, without a draw: rpka.attention.rpka)
LONGRANGE_FULL_RANK = 2 * max(LONGRANGE_CONTEXTS)
# the long-range studies' structure in seconds (tests): a short context, a narrow window,
# the curriculum from 64 tokens and the positive control
LONGRANGE_SMOKE: dict[str, Any] = {
    "train_windows": 16,
    "eval_windows": 8,
    "ranks": (4, 8, 160),
    "window": 8,
    "track": dataclasses.replace(LONGRANGE_TRACK, min_distance=24, n_copies=2),
    "warm_start_from": 64,
    "model": dataclasses.replace(LONGCTX_MODEL, d_model=8, n_heads=1, d_ff=16, embed_kernel=5),
    "train": TrainConfig(epochs=1, batch_size=8, warmup_steps=0),
    "primary_arm": "rpka-r8",
    "positive_control_arm": "rpka-r160",
    "learning_rates": (1e-2,),
    "sweep_seeds": (0,),
    "n_workers": 1,
    "seeds_per_job": 2,
}
LONGRANGE_PRESETS: dict[str, LongContextConfig] = {
    # the study's structure in seconds (tests): a short context, a narrow window, the
    # curriculum from the first context and the positive control
    "longrange-smoke": _longrange(
        "longrange-smoke",
        contexts=(64, 80),
        peers=(peer_arm("nystrom-uniform", 8),),
        eval_seeds=(100, 101),
        **LONGRANGE_SMOKE,
    ),
    # The study (issue 27): 512, 1,024 and 2,048 tokens, the same model and training at
    # every length (500 steps of batch 8; above 512 after the same 500 at 512), 8 evaluation
    # seeds (the gate's one-sided p can reach 1/256, the primary's two-sided 1/128). Cost:
    # docs/longctx.md.
    "longrange": _longrange(
        "longrange",
        contexts=LONGRANGE_CONTEXTS,
        train_windows=4000,
        eval_windows=256,
        ranks=(*LONGRANGE_RANKS, LONGRANGE_FULL_RANK),
        peers=(peer_arm("nystrom-uniform", 64),),
        warm_start_from=LONGRANGE_WARM_START,
        model=LONGCTX_MODEL,
        train=LONGRANGE_TRAIN,
        primary_arm="rpka-r64",
        positive_control_arm=f"rpka-r{LONGRANGE_FULL_RANK}",
        learning_rates=(1e-2,),
        sweep_seeds=(0,),
        eval_seeds=tuple(range(100, 108)),
        seeds_per_job=4,
    ),
}
# The standard study's long context (issue 28): the long-range track at 512 tokens, the one
# length that learns without a curriculum (1,024 and 2,048 tokens learn only after 512
# first, at about twice the cost and more; docs/longctx.md): exact, the primary rpka-r64,
# the positive control rpka-r1024 (every one of the 2 x 512 joint points: exact attention
# by Nystrom's identity, without a draw) and both controls, at the full study's training
# and rate;
# 6 evaluation seeds in jobs of 3 (docs/standard.md).
LONGRANGE_PRESETS["standard"] = _longrange(
    "standard",
    contexts=(512,),
    train_windows=4000,
    eval_windows=256,
    ranks=(64, 1024),
    peers=(),
    model=LONGCTX_MODEL,
    train=LONGRANGE_TRAIN,
    primary_arm="rpka-r64",
    positive_control_arm="rpka-r1024",
    learning_rates=(1e-2,),
    sweep_seeds=(0,),
    eval_seeds=tuple(range(100, 106)),
    seeds_per_job=3,
)

# --------------------------------------------------------------------------- long range, power
# Issue 40: the pre-registered long-range study (docs/longrange_protocol.md): 1,024, 2,048
# and 4,096 tokens after the curriculum's 512, 16 evaluation seeds each with its own draw of
# the data (rpka.training.seed_data), RPKA and uniform landmarks at the same four ranks, the
# key-side coreset at 64, both negative controls and the full-rank positive control. One
# length (or some arms) at a time: `python -m rpka longctx --preset longrange-power
# --contexts 4096 [--arms ...]`, resumed run by run.
# The cuts of docs/longrange_protocol.md ("Price"), made before any run: priced at 75,271
# CPU-s with every arm at 1,024 / 2,048 / 4,096 tokens, over the ~45,000 budget, so in the
# issue's order: keys-coreset-r64, the positive control at all but one length (2,048: the
# one kept, since 1,024 goes too), rank 32, then 1,024 tokens
POWER_RANKS = (16, 64, 128)
POWER_CONTEXTS = (2048, 4096)
POWER_EVAL_SEEDS = tuple(range(200, 216))  # 16 seeds no earlier study used; p can reach 2^-16
POWER_FULL_RANK = 2 * max(POWER_CONTEXTS)  # >= the 2n joint points at every length


def _power_arms(ranks: tuple[int, ...]) -> tuple[ArmConfig, ...]:
    """The study's peer: ``nystrom-uniform`` at every rank of RPKA's."""
    return tuple(peer_arm("nystrom-uniform", r) for r in ranks)


LONGRANGE_PRESETS["longrange-power-smoke"] = _longrange(  # its structure in seconds (tests)
    "longrange-power-smoke",
    contexts=(72, 80),
    peers=_power_arms((4, 8)),
    eval_seeds=(100, 101, 102),
    data_per_seed=True,
    **LONGRANGE_SMOKE,
)
LONGRANGE_PRESETS["longrange-power"] = _longrange(
    "longrange-power",
    contexts=POWER_CONTEXTS,
    train_windows=4000,
    eval_windows=256,
    ranks=(*POWER_RANKS, POWER_FULL_RANK),
    peers=_power_arms(POWER_RANKS),
    warm_start_from=LONGRANGE_WARM_START,
    model=LONGCTX_MODEL,
    train=LONGRANGE_TRAIN,
    primary_arm="rpka-r64",
    positive_control_arm=f"rpka-r{POWER_FULL_RANK}",
    learning_rates=(1e-2,),
    sweep_seeds=(0,),
    eval_seeds=POWER_EVAL_SEEDS,
    data_per_seed=True,
    seeds_per_job=4,
)
LONGCTX_PRESETS.update(LONGRANGE_PRESETS)
LONGCTX_FIELDS = ("contexts", "train_windows", "eval_windows", "memory_probe", "warm_start_from")


def get_longctx_preset(name: str, **overrides: Any) -> LongContextConfig:
    """The long-context preset ``name`` with overrides, validated.

    ``contexts``, ``train_windows``, ``eval_windows``, ``memory_probe`` and
    ``warm_start_from`` replace the
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


def with_arms(config: LongContextConfig, names: list[str] | tuple[str, ...]) -> LongContextConfig:
    """``config`` training only the arms ``names`` and those its decision needs (the
    baseline, the primary arm and the gate's controls): one invocation of a study run arm
    by arm (every run resumes by its run id, which does not depend on the other arms). The
    positive control stays only if named. Unknown names raise ``ValueError`` listing the
    study's arms."""
    bench = config.bench
    known = [arm.name for arm in bench.design.arms]
    unknown = sorted(set(names) - set(known))
    require(not unknown, "arms", f"names among {known}", unknown)
    needed = {
        bench.decision.baseline_arm,
        bench.decision.primary_arm,
        bench.control,
        bench.local_control,
    }
    keep = (set(names) | needed) - {None}
    positive = (
        bench.decision.positive_control_arm
        if bench.decision.positive_control_arm in names
        else None
    )
    arms = tuple(arm for arm in bench.design.arms if arm.name in keep)
    config = dataclasses.replace(
        config, bench=bench.replace(arms=arms, positive_control_arm=positive)
    )
    config.validate()
    return config


POWER_PRESET = "longrange-power"  # the pre-registered long-range study (issue 40)
POWER_POSITIVE_CONTROL_AT = 2048  # the one length its positive control runs at (the price's cuts)


def power_as_run() -> list[LongContextConfig]:
    """The pre-registered study as its protocol runs it (docs/longrange_protocol.md,
    "Price"), one configuration per length: every arm, the positive control at
    :data:`POWER_POSITIVE_CONTROL_AT` tokens only (``longctx --arms`` without it elsewhere)."""
    study = LONGRANGE_PRESETS[POWER_PRESET]
    lengths = []
    for context in study.contexts:
        config = dataclasses.replace(study, contexts=(context,))
        if context != POWER_POSITIVE_CONTROL_AT:
            positive = config.bench.decision.positive_control_arm
            config = with_arms(config, [a for a in config.bench.design.arm_names if a != positive])
        lengths.append(config)
    return lengths

# --------------------------------------------------------------------------- long range, v2
# Issue 53: the decision study (docs/longrange_protocol_v2.md), registered before its runs.
# 4,096 tokens only, the curriculum's 512 first; the arms its two questions need (RPKA
# against uniform landmarks at rank 64, and RPKA r64 against exact) and uniform r128, the
# pilot's cheapest robust arm; mean-attention as the negative control. The local-window
# control is left out: its gate passed in the pilot (p 1.5e-5) and it costs ~245 CPU-s a seed
# and ran out of memory with two workers (protocol, "Price"). 32 seeds no earlier study used,
# each with its own data; one interim look after the first 16 (V2_INTERIM_SEEDS).
V2_PRESET = "longrange-v2"
V2_CONTEXT = 4096
V2_RANK = 64
V2_EVAL_SEEDS = tuple(range(300, 332))
V2_INTERIM_SEEDS = V2_EVAL_SEEDS[:16]
V2_ARMS = (
    EXACT,
    rpka_arm(V2_RANK, residual_solve=LONGCTX_RESIDUAL_SOLVE),
    peer_arm("nystrom-uniform", V2_RANK),
    peer_arm("nystrom-uniform", 2 * V2_RANK),
    MEAN_CONTROL,
)
LONGRANGE_PRESETS[V2_PRESET] = long_preset(
    V2_PRESET,
    (V2_CONTEXT,),
    4000,
    256,
    LONGRANGE_TRACK,
    V2_ARMS,
    LONGRANGE_WARM_START,
    model=LONGCTX_MODEL,
    train=LONGRANGE_TRAIN,
    primary_arm=f"rpka-r{V2_RANK}",
    learning_rates=(1e-2,),
    sweep_seeds=(0,),
    eval_seeds=V2_EVAL_SEEDS,
    data_per_seed=True,
    seeds_per_job=4,
)
LONGCTX_PRESETS[V2_PRESET] = LONGRANGE_PRESETS[V2_PRESET]
# The same study on the interim look's 16 seeds: run first, so the interim's runs land before
# the rest (its run ids are the full study's: a run id depends on the run, not the preset)
V2_INTERIM_PRESET = f"{V2_PRESET}-interim"
LONGCTX_PRESETS[V2_INTERIM_PRESET] = LONGRANGE_PRESETS[V2_INTERIM_PRESET] = dataclasses.replace(
    get_longctx_preset(V2_PRESET, eval_seeds=V2_INTERIM_SEEDS), preset=V2_INTERIM_PRESET
)
