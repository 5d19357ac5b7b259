"""The long-context studies (``python -m rpka longctx``): ``LONGCTX_PRESETS`` and
:func:`get_longctx_preset`; one bench per context length, every context sharing the
template ``BenchConfig`` of its preset (``rpka.longctx``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rpka.config import (
    ArmConfig,
    BenchConfig,
    LongContextConfig,
    TrainConfig,
    apply_overrides,
    local_arm,
    peer_arm,
)
from rpka.model import ModelConfig
from rpka.presets import EXACT, FORECAST_MARGIN, MEAN_CONTROL, QUICK_EVAL_SEEDS, rpka_arm
from rpka.tracks.lookup import LookupConfig
from rpka.tracks.regimes import RegimesConfig

# --------------------------------------------------------------------------- long context
# The long-context training study (issues 6 and 14; ``rpka.longctx``): one bench per
# context length, every context sharing the template ``BenchConfig`` of its preset, the
# track resized to each context by ``Task.at_context``.


# RPKA's proposal refresh at long context (issue 16, docs/speed.md): by L^{-1} and matrix
# products instead of a triangular solve against every point - the same pivot law (the
# residuals agree to round-off), ~2.5x faster at 2,048 tokens, where the refresh was the
# largest single cost of a training step (0.72x exact's step with the triangular solve,
# 0.49x with this one, scripts/bench_training_step.py). Not bitwise the default's draws, so
# the long-context study was rerun with it (2026-12-01, quiet machine): rpka-r64's step
# 0.48x exact's at 2,048 tokens inside the study (0.79x before, under load).
LONGCTX_RESIDUAL_SOLVE = "inverse"


def _long_preset(
    preset: str,
    contexts: tuple[int, ...],
    train_windows: int,
    eval_windows: int,
    track: Any,
    arms: tuple[ArmConfig, ...],
    **bench: Any,
) -> LongContextConfig:
    """A long-context preset of ``arms`` on ``track``, resized to each context; ``bench``
    sets the template's other fields."""
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
    config = LongContextConfig(preset, contexts, template, train_windows, eval_windows)
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
    return _long_preset(preset, contexts, train_windows, eval_windows, track, arms, **bench)


# The long-context form of forecast-regimes (issue 14): 3 regimes of period 7-10 in
# segments of 20-39 steps, so the regime the window returns to recurs all over the
# context (about a third of it) and the forecast reads on from any earlier occurrence at
# the right phase - attention over the whole context, the same task at every length. The
# model reads the forecast off the last token (ModelConfig.readout = "last"), whose input
# window of 17 steps holds the cue; a key's window holds the 8 steps after it, so one
# attention layer can match cue to occurrence and copy the continuation.
#
# Measured with scripts/longctx_probe.py (one seed each, 250 steps of batch 16 = 4,000
# training windows, 256 test windows, learning rate 1e-2, on the 2-core machine shared with
# other jobs; ``--context 512`` / ``--context 128``, variants by ``--model`` / ``--track``):
# at 2,048 tokens exact 0.232 test MSE, mean-attention 0.465, least-squares linear 0.589,
# seasonal naive 1.17; at 512 tokens 0.200 / 0.472 / 0.332 / 1.19 (rpka-r16 0.371); at 128
# tokens 0.225 / 0.461 / 0.319 - the task is about as hard at every length. What did not
# learn in that budget: the flatten head (``readout="flatten"``, L x d_model x horizon
# weights, more than there are training windows) at 512 tokens (d_model 16, one head,
# periods 7-16: exact 0.81-0.86, control 0.71, 250-500 steps, lr 3e-3 / 1e-2); periods
# 12-16 in 16 regimes (about one earlier occurrence) even at 128 tokens (flatten head:
# exact 0.61, control 0.67 after 1,000 steps); periods 4-8 (the input window alone
# forecasts them: control 0.062, exact 0.058 at 128 tokens). A single earlier occurrence
# per window - the regimes docstring's 16 / 64 regimes - would need far longer training
# than this study can afford.
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
    # The study at 512 tokens (the quick preset until issue 16 cut it to a preview; now the
    # full preset's first length); one training step (1 seed, batch 16, one thread; ``python
    # scripts/longctx_probe.py --step-time``, on the busy machine) measured
    # 0.088 CPU-s exact, 0.070 rpka-r16, 0.186 rpka-r64, 0.029 the control: 7 runs (1
    # sweep + 6 evaluation seeds) of 250 steps per arm, about 650 CPU-s. Run (``python -m
    # rpka longctx --preset quick``, load average 11-13 from other jobs): its training runs
    # took 726 CPU-s (about 6 minutes on 2 idle cores; 27 minutes wall on the busy machine);
    # the gate passed - exact 0.260 +- 0.089 test MSE, mean-attention 0.488 (+88 %, one-sided
    # p = 1/64), rpka-r64 0.287 and rpka-r16 0.381 (both significant losses, p = 1/32);
    # least-squares linear 0.332, so exact is 0.78 x linear: the track's 0.5 bar is not met
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
    # both lengths. At 2,048 tokens a step measured 0.99 CPU-s exact, 0.27 rpka-r16, 0.64
    # rpka-r64, 0.088 the control - and 2.16 rpka-r128 (its sequential pivot loop: slower
    # than exact, so r128 is left out). About 650 + 3,500 CPU-s: some 35 minutes on 2 idle
    # cores, over the 10 minutes this study was meant to cost; exact alone at 2,048 tokens
    # (7 runs x 250 steps) takes 1,730 CPU-s, and fewer steps learn less.
    "full": _longctx("full", contexts=(512, 2048), **REGIMES_STUDY),
}

# --------------------------------------------------------------------------- long range
# Issue 27: a task whose answer lies far back (forecast-lookup: cue-payload pairs anywhere
# but in the context's last min_distance steps, the query cue at the end), the local window
# as a second control and the two-control gate (BenchConfig.gate_needs_local): the verdicts
# count only where exact beats both mean-attention and local-w128 by >= 25 % (one-sided
# p < 0.05).
LOCAL_WINDOW = 128  # the local control's window at long context (issue 27)
# no pair within the local window plus the embedding's reach on both sides: a token sees
# embed_kernel // 2 steps either side, so a band of 128 tokens ending at the last one reaches
# no payload step (lookup module docstring)
# One pair (a fixed cue, a fresh payload) occurring 8 times, all far back: measured with
# scripts/longctx_probe.py --preset longrange at 512 tokens (one seed, 250 steps of batch 16,
# lr 1e-2, the longrange model): a single occurrence learned nothing (exact 0.969 test MSE =
# the mean forecast's, also after 1,000 steps, lr 1e-2 or 3e-3, cue_scale 2 or 4); 4
# occurrences 0.774 (mean forecast 0.778); 8 occurrences 0.440 (mean forecast 0.653,
# linear 0.718); two pairs of 8 occurrences each 0.391 (linear 0.615). Docs: docs/longctx.md.
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
    uniform_rank: int | None,
    window: int = LOCAL_WINDOW,
    track: LookupConfig = LONGRANGE_TRACK,
    **bench: Any,
) -> LongContextConfig:
    """A long-range preset on ``forecast-lookup``: exact, RPKA at ``ranks``,
    ``nystrom-uniform`` at ``uniform_rank`` (None: none), and both controls (mean-attention,
    ``local-w<window>``) under the two-control gate; ``bench`` sets the template's other
    fields (model, train, seeds, ...)."""
    arms: tuple[ArmConfig, ...] = (
        EXACT,
        *(rpka_arm(r, residual_solve=LONGCTX_RESIDUAL_SOLVE) for r in ranks),
        *((peer_arm("nystrom-uniform", uniform_rank),) if uniform_rank is not None else ()),
        MEAN_CONTROL,
        local_arm(window),
    )
    return _long_preset(
        preset, contexts, train_windows, eval_windows, track, arms, gate_needs_local=True, **bench
    )


# Priced with the cost model (scripts/longrange_locality.py --cost --probe-eval-windows 32,
# 2026-12-02, busy machine; data/results/full/longrange/cost_model_r128.json) with r128 in:
# 10,362 CPU-s - 512: 1,436 (exact 121, r16 100, r64 239, r128 572, nystrom-uniform-r64 221,
# mean 40, local-w128 143); 1,024: 2,825 (exact 405, r16 192, r64 400, r128 1,006, uniform
# 297, mean 92, local 433); 2,048: 6,101 (exact 1,385, r16 426, r64 810, r128 1,438,
# uniform 685, mean 148, local 1,208). Over the ~7,000 CPU-s budget, so r128 (break-even
# with exact at 2,048: 1,438 vs 1,385) is an extension: `--ranks 16 64 128` resumes every
# finished run and trains only r128 (+3,016 CPU-s). Without it: 7,346 CPU-s.
LONGRANGE_RANKS = (16, 64)
LONGRANGE_TRAIN = TrainConfig(epochs=1, batch_size=8, warmup_steps=2)
LONGRANGE_PRESETS: dict[str, LongContextConfig] = {
    # the study's structure in seconds (tests): a short context, a narrow window
    "longrange-smoke": _longrange(
        "longrange-smoke",
        contexts=(64, 80),
        train_windows=16,
        eval_windows=8,
        ranks=(4, 8),
        uniform_rank=8,
        window=8,
        track=dataclasses.replace(LONGRANGE_TRACK, min_distance=24, n_copies=2),
        model=dataclasses.replace(LONGCTX_MODEL, d_model=8, n_heads=1, d_ff=16, embed_kernel=5),
        train=TrainConfig(epochs=1, batch_size=8, warmup_steps=0),
        primary_arm="rpka-r8",
        learning_rates=(1e-2,),
        sweep_seeds=(0,),
        eval_seeds=(100, 101),
        n_workers=1,
        seeds_per_job=2,
    ),
    # The study (issue 27): 512, 1,024 and 2,048 tokens, the same model and training at
    # every length - one epoch of 4,000 windows in batches of 8 (500 steps), learning rate
    # 1e-2 on one sweep seed, 8 evaluation seeds (the gate's one-sided p can reach 1/256, the
    # primary's two-sided 1/128). Learnability (one seed, scripts/longctx_probe.py): at 512
    # tokens exact 0.083 test MSE after these 500 steps (linear 0.718); 0.016 after 500 steps
    # of batch 16, 0.440 after 250 (local-w128 0.630, mean-attention 0.599 there); at 1,024
    # tokens 0.112 after 250 steps of batch 16 and 0.357 after these 500 (linear 1.008); at
    # 2,048 tokens 0.896 after these 500 steps - not learned (naive mean 0.897, linear 1.776),
    # nor after 250 steps of batch 16 or 1,000 steps of batch 8 (0.896 both).
    # Cost: docs/longctx.md.
    "longrange": _longrange(
        "longrange",
        contexts=(512, 1024, 2048),
        train_windows=4000,
        eval_windows=256,
        ranks=LONGRANGE_RANKS,
        uniform_rank=64,
        model=LONGCTX_MODEL,
        train=LONGRANGE_TRAIN,
        primary_arm="rpka-r64",
        learning_rates=(1e-2,),
        sweep_seeds=(0,),
        eval_seeds=tuple(range(100, 108)),
        seeds_per_job=4,
    ),
}
# The standard study's long context (issue 28): the long-range track at 512 tokens, the
# length whose two-control gate passes in the full study (at 1,024 tokens exact misses its
# learnability bar, at 2,048 it does not learn): exact, the primary rpka-r64, the positive
# control rpka-r1024 (every one of the 2 x 512 joint points: exact attention by Nystrom's
# identity, without a draw) and both controls, at the full study's training and rate;
# 6 evaluation seeds in jobs of 3 (docs/standard.md).
LONGRANGE_PRESETS["standard"] = _longrange(
    "standard",
    contexts=(512,),
    train_windows=4000,
    eval_windows=256,
    ranks=(64, 1024),
    uniform_rank=None,
    model=LONGCTX_MODEL,
    train=LONGRANGE_TRAIN,
    primary_arm="rpka-r64",
    positive_control_arm="rpka-r1024",
    learning_rates=(1e-2,),
    sweep_seeds=(0,),
    eval_seeds=tuple(range(100, 106)),
    seeds_per_job=3,
)
LONGCTX_PRESETS.update(LONGRANGE_PRESETS)
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
