"""Each track's named studies, as values of ``rpka.config.bench``'s dataclasses:
``FORECAST_PRESETS`` (the forecast track: ``smoke`` for tests and CI, ``quick`` for a few
minutes, ``full`` for the real study - the rank sweep, RPKA's ablations and the peers -
``quick-study``, the full study's arms at the quick size, and ``smoke-study``, its
structure in miniature for tests),
``LM_PRESETS`` (``smoke`` / ``quick`` / ``full`` of the ``lm`` track) and
``MOTIF_PRESETS``, ``REGIMES_PRESETS``, ``REAL_PRESETS`` and ``RECALL_PRESETS``: the
``smoke`` (seconds, for tests), ``quick`` (previews), ``gate`` (the attention gate alone)
and ``full`` studies of the tracks that need attention (issue 14). ``rpka.config.presets`` adds
the standard study and looks presets up; how each size was chosen (what was measured,
when): docs/presets.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rpka.config.bench import (
    ArmConfig,
    BenchConfig,
    TrainConfig,
    peer_arm,
    rpka_arm,
)
from rpka.model import ModelConfig
from rpka.tracks.forecast import TrackConfig
from rpka.tracks.lm import LMConfig
from rpka.tracks.motif import MotifConfig
from rpka.tracks.real import RealConfig
from rpka.tracks.recall import RecallConfig
from rpka.tracks.regimes import RegimesConfig

EXACT = ArmConfig("exact", "exact", {})
# Equivalence margins (TOST, metric units; docs/statistics.md), fixed before the data
FORECAST_MARGIN = 0.02  # standardised MSE: 2 % of the target's variance
LM_MARGIN = 0.2  # perplexity: 5 % of exact's
RECALL_MARGIN = 0.02  # the error rate at the query positions: 2 points
# the control: uniform attention (q = 0) at exact's tuned rate - how much the track needs
# attention at all
MEAN_CONTROL = ArmConfig("mean-attention", "mean", {}, lr_from="exact")

# The ablations vary one choice of RPKA's default at a time, at the one rank where the
# choices stay visible (docs/presets.md, "forecast"); ``rpka-r16`` is their reference and
# the peers run at the same rank
ABLATION_RANK = 16
# (label, options) of each ablation: one factor changed from RPKA's default
ABLATIONS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("exp", {"weighting": "exp"}),  # pivots ~ the exp kernel's residual (design section 2)
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


def _smoke() -> BenchConfig:
    return BenchConfig.of(
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
        margin=FORECAST_MARGIN,
    )


def _smoke_study() -> BenchConfig:
    """The full study's structure in seconds: one ablation, the uniform rule, one peer, the
    control."""
    return _smoke().replace(
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


# The mechanism check of the studies (MECHANISM_TRACK's full bench; docs/design.md section 3)
STUDY_MECHANISM = {"rank": 16, "draws": 500, "quality_ranks": [4, 8, 16, 32], "quality_seeds": 5}
# and of the quick preview (motif's bench): the same rank, fewer draws and quality points
QUICK_MECHANISM = {"rank": 16, "draws": 200, "quality_ranks": [4, 16], "quality_seeds": 3}


# The quick preset of every track previews the pipeline in minutes (issue 16): the full
# study's arms on 2 evaluation seeds, the least a paired comparison takes (no verdict)
QUICK_EVAL_SEEDS = (100, 101)


def _quick() -> BenchConfig:
    return BenchConfig.of(
        preset="quick",
        track=TrackConfig(n_series=16),
        model=ModelConfig(),
        train=TrainConfig(epochs=2),
        arms=(EXACT, rpka_arm(4), rpka_arm(16)),
        primary_arm="rpka-r16",
        learning_rates=(1e-3, 3e-3),
        sweep_seeds=(0,),
        eval_seeds=QUICK_EVAL_SEEDS,
        mechanism=None,  # the preview's mechanism check is the motif bench's (MECHANISM_TRACK)
        margin=FORECAST_MARGIN,
    )


# The ablations take their reference's rate (lr_from) and rpka-r64 the plain pivot loop:
# the full study's budget cuts (docs/presets.md, "forecast").
R64_PIVOT_METHOD = "plain"


def _full() -> BenchConfig:
    ablations, peers = ablation_arms(), peer_arms()
    reference = f"rpka-r{ABLATION_RANK}"
    uniform = f"nystrom-uniform-r{ABLATION_RANK}"  # the pivot rule's "uniform" level
    ablations = tuple(dataclasses.replace(a, lr_from=reference) for a in ablations)
    peers = tuple(
        dataclasses.replace(a, lr_from=reference) if a.name == uniform else a for a in peers
    )
    return BenchConfig.of(
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
        # 9 seeds: Holm over the 11 secondary arms can reject (2 / 2^9 < 0.05 / 11)
        eval_seeds=tuple(range(100, 109)),
        output_error_ranks=(16, 64, 128),
        ablation_reference=reference,
        ablation_arms=tuple(a.name for a in ablations) + (uniform,),
        margin=FORECAST_MARGIN,
    )


def _quick_study() -> BenchConfig:
    """The full study's arms at the quick preset's size (minutes): a preview of the report."""
    return _full().replace(
        preset="quick-study",
        track=TrackConfig(n_series=16),
        learning_rates=(1e-3, 3e-3),
        eval_seeds=(100, 101, 102, 103),
        mechanism=STUDY_MECHANISM,
    )


FORECAST_PRESETS: dict[str, BenchConfig] = {
    "smoke": _smoke(),
    "smoke-study": _smoke_study(),
    "quick": _quick(),
    "quick-study": _quick_study(),
    "full": _full(),
}


# --------------------------------------------------------------------------- track lm
# The causal decoder on the Markov-copy source (issue 7): about three quarters of the
# tokens are copies, so the copy circuit appears early on every seed (docs/presets.md, "lm").
# Every copy lag is >= the causal block: a copied token lies in an earlier block, so
# copying goes through the landmarks (the approximate part of causal RPKA), never the exact
# local block.
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
LM_RANKS = (16, 32, 64, 96)


def lm_rpka_arm(rank: int) -> ArmConfig:
    """Causal RPKA at ``rank`` with the lm track's causal block."""
    return rpka_arm(rank, causal_block=LM_CAUSAL_BLOCK)


def _lm_smoke() -> BenchConfig:
    return BenchConfig.of(
        preset="smoke",
        track=LMConfig(vocab_size=12, lags=(8, 12), seq_len=33, n_train=64, n_val=16, n_test=16),
        model=ModelConfig(
            d_model=16, n_layers=1, n_heads=2, d_ff=32, embed_kernel=1, linear_skip=False
        ),
        train=TrainConfig(epochs=2, batch_size=16, warmup_steps=1),
        arms=(EXACT, rpka_arm(4, causal_block=8), rpka_arm(8, causal_block=8), MEAN_CONTROL),
        primary_arm="rpka-r4",
        learning_rates=(3e-3,),
        sweep_seeds=(0,),
        eval_seeds=(100, 101),
        metric="perplexity",
        margin=LM_MARGIN,
        n_workers=1,
        mechanism={"rank": 4, "draws": 200, "quality_ranks": [2, 4, 8], "quality_seeds": 3},
    )


def _lm_quick() -> BenchConfig:
    """The full lm study's arms and model with one learning rate, the preview's evaluation
    seeds and 3 of its 12 epochs on a quarter of its sequences (a preview)."""
    return _lm_full().replace(
        preset="quick",
        arms=(EXACT, lm_rpka_arm(16), lm_rpka_arm(32), MEAN_CONTROL),  # not the frontier
        positive_control_arm=None,
        track=dataclasses.replace(LM_TRACK, n_train=256),
        train=dataclasses.replace(LM_TRAIN, epochs=3),
        learning_rates=(1e-2,),
        sweep_seeds=(0,),
        eval_seeds=QUICK_EVAL_SEEDS,
    )


def _lm_full() -> BenchConfig:
    return BenchConfig.of(
        preset="full",
        track=LM_TRACK,
        model=LM_MODEL,
        train=LM_TRAIN,
        # r64 and r96 (the positive control: the last block's past, 96 joint points, is
        # computed exactly) trace the rank frontier (docs/statistics.md section 8)
        arms=(EXACT, *(lm_rpka_arm(r) for r in LM_RANKS), MEAN_CONTROL),
        primary_arm="rpka-r32",
        positive_control_arm="rpka-r96",
        learning_rates=(3e-3, 1e-2, 3e-2),  # extended upward: 1e-2 won a two-point grid
        sweep_seeds=(0, 1),
        eval_seeds=tuple(range(100, 108)),
        metric="perplexity",
        mechanism=None,  # the mechanism study is the forecast track's
        margin=LM_MARGIN,
    )


LM_PRESETS: dict[str, BenchConfig] = {
    "smoke": _lm_smoke(),
    "quick": _lm_quick(),
    "full": _lm_full(),
}


# --------------------------------------------------------------------------- attention-gate tracks
# The tracks that need attention (issue 14): ``smoke`` runs each through the bench in
# seconds (tests, CI); ``gate`` is its attention gate - exact, the control, RPKA at a few
# ranks - at the sizes scripts/track_learnability.py measured (docs/presets.md, "gate tracks")
GATE_ARMS = (EXACT, MEAN_CONTROL, rpka_arm(8), rpka_arm(16), rpka_arm(32))
GATE_MODEL = ModelConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64)
GATE_TRAIN = TrainConfig(epochs=10, batch_size=64)  # ~3,100 steps: what exact needs


def _window_smoke(track: Any, embed_kernel: int) -> BenchConfig:
    return _smoke().replace(
        track=track,
        model=dataclasses.replace(_smoke().design.model, embed_kernel=embed_kernel),
        arms=(EXACT, MEAN_CONTROL, rpka_arm(4)),
        mechanism=None,
        output_error_ranks=(),
    )


def _window_gate(track: Any, embed_kernel: int) -> BenchConfig:
    return BenchConfig.of(
        preset="gate",
        track=track,
        model=dataclasses.replace(GATE_MODEL, embed_kernel=embed_kernel),
        train=GATE_TRAIN,
        arms=GATE_ARMS,
        primary_arm="rpka-r16",
        learning_rates=(1e-3, 3e-3),
        sweep_seeds=(0,),
        eval_seeds=tuple(range(100, 108)),
        mechanism=None,
        margin=FORECAST_MARGIN,
    )


def _window_full(track: Any, embed_kernel: int, **changes: Any) -> BenchConfig:
    """The study's form (``full``): exact, the control and the primary RPKA arm at one
    learning rate, 6 evaluation seeds.

    Cut to the CPU budget (issue 16; docs/presets.md, "gate tracks"): one rate, 1e-3, for
    every arm (the report says it was fixed, not swept), one RPKA rank, and 6 evaluation
    seeds, the smallest n at which the rule can reject (two-sided sign-flip floor 2/2^6).
    """
    full = {
        "preset": "full",
        "arms": (EXACT, MEAN_CONTROL, rpka_arm(16)),
        "learning_rates": (1e-3,),
        "eval_seeds": tuple(range(100, 106)),
    }
    return _window_gate(track, embed_kernel).replace(**(full | changes))


def _window_quick(full: BenchConfig, **track: Any) -> BenchConfig:
    """A preview of ``full`` in a minute: its arms on a few hundred windows for 2 epochs,
    the preview's 2 evaluation seeds (the gate cannot pass; the report says it is a
    preview)."""
    return full.replace(
        preset="quick",
        track=dataclasses.replace(full.design.track, **track),
        train=dataclasses.replace(full.design.train, epochs=2),
        eval_seeds=QUICK_EVAL_SEEDS,
    )


# The study's mechanism check (the trace identity, docs/design.md section 3) runs on the
# motif track's trained RPKA model: sharp retrieval heads, where a sampler or Schur-update
# bug would show. The forecast and lm benches keep a check of their own.
MECHANISM_TRACK = "forecast-motif"
SMALL_WINDOWS = {"n_train": 128, "n_val": 32, "n_test": 32}
QUICK_WINDOWS = {"n_train": 512, "n_val": 256, "n_test": 256}
# Ablation and peers on the track that passes its gate (issue 14), at RPKA's rank 16: the
# pivot rule's "uniform" level (nystrom-uniform) and the keys coreset (the best low-rank
# drop-in, docs/numerics.md); 7 evaluation seeds, so Holm over the two can reject
MOTIF_PEERS = (peer_arm("nystrom-uniform", ABLATION_RANK), peer_arm("keys-coreset", ABLATION_RANK))
_MOTIF_FULL = _window_full(
    MotifConfig(),
    embed_kernel=17,
    mechanism=STUDY_MECHANISM,
    arms=(EXACT, MEAN_CONTROL, rpka_arm(ABLATION_RANK), *MOTIF_PEERS),
    eval_seeds=tuple(range(100, 107)),
    ablation_reference=f"rpka-r{ABLATION_RANK}",
    ablation_arms=(MOTIF_PEERS[0].name,),
)
_REGIMES_FULL = _window_full(RegimesConfig(), embed_kernel=5)
# ~1,000 steps of batch 64 on CO2's 1,259 training windows
_REAL_FULL = _window_full(RealConfig(), embed_kernel=5, train=TrainConfig(epochs=50, batch_size=64))
MOTIF_PRESETS: dict[str, BenchConfig] = {
    "smoke": _window_smoke(MotifConfig(**SMALL_WINDOWS), embed_kernel=17).replace(
        mechanism=_smoke().studies.mechanism
    ),
    "quick": _window_quick(_MOTIF_FULL, **QUICK_WINDOWS).replace(mechanism=QUICK_MECHANISM),
    "gate": _window_gate(MotifConfig(), embed_kernel=17),
    "full": _MOTIF_FULL,
}
REGIMES_PRESETS: dict[str, BenchConfig] = {
    "smoke": _window_smoke(RegimesConfig(**SMALL_WINDOWS), embed_kernel=5),
    "quick": _window_quick(_REGIMES_FULL, **QUICK_WINDOWS),
    "gate": _window_gate(RegimesConfig(), embed_kernel=5),
    "full": _REGIMES_FULL,
}
REAL_PRESETS: dict[str, BenchConfig] = {
    "smoke": _window_smoke(RealConfig(context=52, stride=8), embed_kernel=5),
    "quick": _REAL_FULL.replace(
        preset="quick",
        train=TrainConfig(epochs=2, batch_size=64),
        eval_seeds=QUICK_EVAL_SEEDS,
    ),
    "gate": _window_gate(RealConfig(), embed_kernel=5).replace(
        train=TrainConfig(epochs=50, batch_size=64)
    ),
    "full": _REAL_FULL,
}
# --------------------------------------------------------------------------- recall (MQAR)
# Each token also embeds its predecessor (``previous_tokens=1``, Zoology's short
# convolution): a value token carries its key, so one attention layer can match a query
# against it; a plain causal model does not learn recall. Sizes: docs/presets.md, "recall".
RECALL_MODEL = ModelConfig(
    d_model=64,
    n_layers=2,
    n_heads=2,
    d_ff=128,
    embed_kernel=1,
    linear_skip=False,
    previous_tokens=1,
)
RECALL_TRACK = RecallConfig(n_train=10_000, n_val=250, n_test=250)
RECALL_TRAIN = TrainConfig(epochs=2, batch_size=64)  # 312 steps
# rank / pairs 0.5, 1, 2 at the lm presets' causal block (the pairs fill block 0: every
# query reaches its pair through the landmarks). The peers refuse causal=True (they pool
# over the whole sequence): on this track RPKA is the only low-rank method.
RECALL_RANKS = (4, 8, 16)
# the rank frontier (docs/statistics.md section 8): ranks up to where RPKA stops losing, and
# the positive control - rank 96 = the joint points of the last block's past (48 positions),
# so every block's past is computed exactly (causal.py): exact by construction
RECALL_FRONTIER_RANKS = (32, 96)


def _recall(preset: str, arms: tuple[ArmConfig, ...], eval_seeds: tuple[int, ...]) -> BenchConfig:
    return BenchConfig.of(
        preset=preset,
        track=RECALL_TRACK,
        model=RECALL_MODEL,
        train=RECALL_TRAIN,
        arms=arms,
        primary_arm="rpka-r8",  # rank = pairs
        learning_rates=(3e-3, 6e-3),
        sweep_seeds=(0,),
        eval_seeds=eval_seeds,
        metric="error",
        mechanism=None,
        margin=RECALL_MARGIN,
    )


RECALL_PRESETS: dict[str, BenchConfig] = {
    "smoke": _lm_smoke().replace(
        model=dataclasses.replace(_lm_smoke().design.model, previous_tokens=1),
        track=RecallConfig(
            vocab_size=17,
            n_pairs=4,
            n_queries=4,
            seq_len=32,
            n_train=64,
            n_val=16,
            n_test=16,
        ),
        arms=(EXACT, MEAN_CONTROL, rpka_arm(4, causal_block=8)),
        metric="error",
        margin=RECALL_MARGIN,
    ),
    # a preview: the gate's arms on 500 sequences, 64 validation and test sequences
    "quick": _recall("quick", (EXACT, MEAN_CONTROL, lm_rpka_arm(8)), QUICK_EVAL_SEEDS).replace(
        track=dataclasses.replace(RECALL_TRACK, n_train=500, n_val=64, n_test=64),
        learning_rates=(3e-3,),
    ),
    # the attention gate alone: exact, the control and RPKA at rank = pairs, 4 seeds
    "gate": _recall("gate", (EXACT, MEAN_CONTROL, lm_rpka_arm(8)), tuple(range(100, 104))),
    # 7 seeds: Holm over the secondary arms can reject (docs/presets.md, "recall")
    "full": _recall(
        "full",
        (EXACT, MEAN_CONTROL, *(lm_rpka_arm(r) for r in RECALL_RANKS + RECALL_FRONTIER_RANKS)),
        tuple(range(100, 107)),
    ).replace(positive_control_arm="rpka-r96"),
}
