"""The named studies: presets of ``rpka.config.bench``'s dataclasses, nothing else. How each
size was chosen (what was measured, when): docs/presets.md; the standard study's:
docs/standard.md.

Each track's own presets are in ``rpka.config.presets_tracks`` (re-exported here); this module
adds the standard study (``STANDARD_PRESETS``, the default ``make report``) and the motif
track's rank frontier. ``PRESETS_BY_TRACK`` maps a track's name to its presets and
``STUDY_TRACKS`` names the tracks a study runs (the report's sections); :func:`get_preset`
(``name``, ``track_name``) returns one, with overrides, validated. The long-context
studies are in ``rpka.config.presets_longctx``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rpka.checks import require
from rpka.config.bench import ArmConfig, BenchConfig, TrainConfig, apply_overrides, rpka_arm
from rpka.config.presets_tracks import (
    _MOTIF_FULL,
    _REAL_FULL,
    ABLATION_RANK,
    ABLATIONS,
    EXACT,
    FORECAST_MARGIN,
    FORECAST_PRESETS,
    LM_CAUSAL_BLOCK,
    LM_MODEL,
    LM_PRESETS,
    LM_TRACK,
    MEAN_CONTROL,
    MECHANISM_TRACK,
    MOTIF_PRESETS,
    PEERS,
    QUICK_EVAL_SEEDS,
    REAL_PRESETS,
    RECALL_PRESETS,
    RECALL_TRACK,
    RECALL_TRAIN,
    REGIMES_PRESETS,
    _full,
    _lm_full,
    lm_rpka_arm,
)
from rpka.tracks.motif import MotifConfig

# --------------------------------------------------------------------------- standard
# The default study (``make report``, issue 28): every track's attention gate, its primary
# verdict and its positive control at the seed count the decision rule needs, each track at
# the one learning rate the full study's sweep chose for all its arms; the extended arms
# stay in ``full``. How each size was chosen and what it measured: docs/standard.md.
#
# 6 evaluation seeds: the primary's two-sided sign-flip floor 2/64 < 0.05, the gate's 1/64
STANDARD_EVAL_SEEDS = tuple(range(100, 106))
# <= 30 min wall on 2 cores, set-up included: ~2,700 CPU-s of training runs, priced from
# the stored probes by tests/test_cost.py
STANDARD_WALL_BUDGET_MIN = 30
STANDARD_TRAINING_BUDGET_CPU_S = 2_700
STANDARD = {
    "preset": "standard",
    "sweep_seeds": (0,),
    "eval_seeds": STANDARD_EVAL_SEEDS,
    "seeds_per_job": 3,
    "ablation_reference": None,
    "ablation_arms": (),
}


def _standard(
    full: BenchConfig, arms: tuple[ArmConfig, ...], lr: float, **changes: Any
) -> BenchConfig:
    """``full``'s track and model with ``arms`` at the one learning rate ``lr``."""
    return full.replace(arms=arms, learning_rates=(lr,), **(STANDARD | changes))


# the standard study of each track; its size and what it measured: docs/standard.md
STANDARD_PRESETS: dict[str, BenchConfig] = {
    # the negative control (its gate fails in the full study): rpka-r16, not the costly r64
    "forecast": _standard(
        _full(),
        (EXACT, rpka_arm(16), MEAN_CONTROL),
        3e-3,
        primary_arm="rpka-r16",
        mechanism=None,  # the study's mechanism check is MECHANISM_TRACK's
        output_error_ranks=(16, 64),
    ),
    # the motif task at 64 tokens and one layer, which exact learns in a fraction of the
    # full form's steps; the non-causal positive control is the long-range track's
    "forecast-motif": _standard(
        _MOTIF_FULL,
        (EXACT, MEAN_CONTROL, rpka_arm(ABLATION_RANK)),
        3e-3,
        track=MotifConfig(
            context=64,
            cue_length=8,
            n_motifs=3,
            gap_max=4,
            n_train=16_000,
            n_val=1_000,
            n_test=1_000,
        ),  # fmt: skip
        model=dataclasses.replace(_MOTIF_FULL.design.model, n_layers=1),
        train=TrainConfig(epochs=6, batch_size=64),  # 1,500 steps
    ),
    # 8 evaluation seeds, as in the full study: 6 could not reject with one seed against
    "lm": _standard(
        _lm_full(),
        (EXACT, lm_rpka_arm(32), lm_rpka_arm(96), MEAN_CONTROL),
        1e-2,
        eval_seeds=tuple(range(100, 108)),
    ),
    # the causal positive control is lm's (same block and length; rpka-r96 here would cost
    # most of the track); 128 validation sequences, as validation is half of a job's cost
    "recall": _standard(
        RECALL_PRESETS["full"],
        (EXACT, MEAN_CONTROL, lm_rpka_arm(8)),
        3e-3,
        track=dataclasses.replace(RECALL_TRACK, n_val=128),
        positive_control_arm=None,
    ),
    # 8 of the full study's 50 epochs: a second negative control (its gate fails in full)
    "forecast-real": _standard(
        _REAL_FULL,
        (EXACT, MEAN_CONTROL, rpka_arm(16)),
        1e-3,
        train=TrainConfig(epochs=8, batch_size=64),
    ),
}
# The motif track's rank frontier at 64 tokens (issue 26; why these arms: docs/frontier.md)
MOTIF_FRONTIER = STANDARD_PRESETS["forecast-motif"].replace(
    preset="frontier",
    arms=(EXACT, MEAN_CONTROL, *(rpka_arm(r) for r in (16, 32, 64, 128))),
    eval_seeds=tuple(range(100, 108)),
    positive_control_arm="rpka-r128",
    mechanism=None,
)
# MQAR as Zoology reports it (issue 26, docs/frontier.md): 4, 16, 24 pairs at 64 tokens,
# at the epochs exact needs to learn each (docs/presets.md, "recall")
RECALL_PAIRS_EPOCHS: dict[int, int] = {4: 2, 16: 6, 24: 6}
RECALL_PAIRS_PRESETS: dict[str, BenchConfig] = {
    f"pairs-{_pairs}": RECALL_PRESETS["full"].replace(
        preset=f"pairs-{_pairs}",
        primary_arm="rpka-r16",
        track=dataclasses.replace(RECALL_TRACK, n_pairs=_pairs),
        train=dataclasses.replace(RECALL_TRAIN, epochs=_epochs),
        arms=(EXACT, MEAN_CONTROL, *(lm_rpka_arm(r) for r in (8, 16, 32))),
        learning_rates=(3e-3,),
        eval_seeds=(100, 101, 102),
        positive_control_arm=None,
    )
    for _pairs, _epochs in RECALL_PAIRS_EPOCHS.items()
}
# every study preset, by track: ``get_preset(name, track_name)`` looks it up here. Plain
# values built from each track's presets (``rpka.config.presets_tracks``, left as they are:
# nothing here changes another module's dicts) and the standard study's.
PRESETS_BY_TRACK: dict[str, dict[str, BenchConfig]] = {
    "forecast": {**FORECAST_PRESETS, "standard": STANDARD_PRESETS["forecast"]},
    "lm": {**LM_PRESETS, "standard": STANDARD_PRESETS["lm"]},
    "forecast-motif": {
        **MOTIF_PRESETS,
        "standard": STANDARD_PRESETS["forecast-motif"],
        "frontier": MOTIF_FRONTIER,
    },
    "forecast-regimes": dict(REGIMES_PRESETS),
    "forecast-real": {**REAL_PRESETS, "standard": STANDARD_PRESETS["forecast-real"]},
    "recall": {**RECALL_PRESETS, "standard": STANDARD_PRESETS["recall"], **RECALL_PAIRS_PRESETS},
}
# the tracks a study runs (each with the study's preset name); the report puts those that
# pass their attention gate first. forecast-regimes runs as the long-context study
# (LONGCTX_PRESETS); its 96-step form is available as `bench --track forecast-regimes`.
STUDY_TRACKS: tuple[str, ...] = ("forecast", "lm", "forecast-motif", "recall", "forecast-real")
# the study presets that preview it (short training, 2 evaluation seeds): no conclusions
PREVIEW_PRESETS: tuple[str, ...] = ("smoke", "quick")
# every preset of the whole study (``python -m rpka report --preset``), cheapest first:
# the previews, the standard study (the default: ``make report``) and the extended one
STUDY_PRESETS: tuple[str, ...] = (*PREVIEW_PRESETS, "standard", "full")


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
    require(
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


__all__ = [  # with each track's presets and parts, re-exported from rpka.config.presets_tracks
    "ABLATION_RANK",
    "ABLATIONS",
    "EXACT",
    "FORECAST_MARGIN",
    "FORECAST_PRESETS",
    "LM_CAUSAL_BLOCK",
    "LM_MODEL",
    "LM_PRESETS",
    "LM_TRACK",
    "MEAN_CONTROL",
    "MECHANISM_TRACK",
    "MOTIF_PRESETS",
    "PEERS",
    "PRESETS_BY_TRACK",
    "PREVIEW_PRESETS",
    "QUICK_EVAL_SEEDS",
    "REAL_PRESETS",
    "RECALL_PRESETS",
    "REGIMES_PRESETS",
    "STANDARD_PRESETS",
    "STANDARD_TRAINING_BUDGET_CPU_S",
    "STANDARD_WALL_BUDGET_MIN",
    "STUDY_PRESETS",
    "STUDY_TRACKS",
    "get_preset",
    "rpka_arm",
]
