"""The bench's post-run studies: what is measured on the trained models once the runs are in.

- the mechanism study (:func:`study_mechanism`): the trace identity and approximation
  quality on the primary arm's trained model, written to ``<out>/mechanism.json``;
- the output-error study (:func:`study_output_errors`): every arm's attention output
  error against exact on trained Q/K, at several ranks.

:func:`run_studies` runs those the configuration asks for and times each. Each resumes
from its earlier output when that was made on the same runs, and reads weights only when
it computes; a run whose weights are missing (they are not committed) is then retrained
(``rpka.bench.jobs.ensure_weights``). (The drop-in study, each method in place of exact's
trained attention, is ``rpka.study.dropin``, run by ``scripts/drop_in.py``.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rpka.attention import options_of
from rpka.bench.jobs import ensure_weights
from rpka.config.bench import BenchConfig
from rpka.io import (
    TIMING_KEYS,
    read_json_or_heal,
    read_run_file,
    write_result_and_timings,
)
from rpka.kernel.quality import mechanism_study, method_output_errors
from rpka.paths import resolve
from rpka.tracks.cache import DEFAULT_DATA_DIR
from rpka.training.train import build_model, track_config_of
from rpka.training.trained import load_trained

OUTPUT_ERROR_SEEDS = 5  # pivot / feature draws per method and rank in the output-error study
OUTPUT_ERROR_DEFINITION = (
    "relative error |O_hat - O|_F / |O|_F of each arm's attention (its method and options, "
    "rank replaced) against exact SDPA in float64, per layer, test window, head and draw, on "
    "the attention inputs (q, k, v) of a trained model: the arm's own ('own') and the exact "
    "arm's ('exact'), first evaluation seed (rpka.quality.method_output_errors)"
)


# --------------------------------------------------------------------------- the stage


@dataclass
class StudyResults:
    """The report's keys the studies fill (None: not asked for) and their durations."""

    mechanism_signature: dict[str, Any] | None = None
    output_error: dict[str, Any] | None = None
    mechanism_s: float = 0.0
    output_error_s: float = 0.0
    retrained: set[str] = field(default_factory=set)  # run ids retrained for their weights


@dataclass
class Weights:
    """Where the studies find trained weights: ``runs_dir``, whose missing ``.pt`` files
    are remade by retraining their run (with the track cache ``data_dir``), noted in
    ``retrained``."""

    runs_dir: Path
    data_dir: str
    progress: bool = False
    retrained: set[str] = field(default_factory=set)

    def load(self, run_id: str) -> tuple[Any, dict[str, Any]]:
        """The trained model of run ``run_id`` and its result
        (``rpka.training.trained.load_trained``)."""
        run_file = self.runs_dir / f"{run_id}.json"
        if ensure_weights(run_file, self.data_dir, self.progress):
            self.retrained.add(run_id)
        return load_trained(run_file)


def run_studies(
    config: BenchConfig,
    eval_of: dict[str, dict[str, Any]],
    runs_dir: Path,
    out: Path,
    track: Any,
    progress: bool = True,
    data_dir: str | None = None,
) -> StudyResults:
    """The post-run studies ``config`` asks for (``mechanism``, ``output_error_ranks``),
    on the evaluation runs ``eval_of`` (by arm) whose run files are in ``runs_dir``
    (missing weights are retrained with the track cache ``data_dir``)."""
    weights = Weights(runs_dir, data_dir or str(resolve(DEFAULT_DATA_DIR)), progress)
    results = StudyResults(retrained=weights.retrained)
    start = time.perf_counter()
    if config.studies.mechanism is not None and config.decision.primary_arm in eval_of:
        results.mechanism_signature = study_mechanism(
            config, eval_of[config.decision.primary_arm], weights, out, track, progress
        )
    middle = time.perf_counter()
    if config.studies.output_error_ranks and config.decision.baseline_arm in eval_of:
        previous = read_json_or_heal(out / "bench_report.json", ("arms",))
        if output_error_current(config, eval_of, previous):
            results.output_error = previous["output_error"]  # resume: same runs, same study
        else:
            results.output_error = study_output_errors(config, eval_of, weights, track)
    results.mechanism_s, results.output_error_s = middle - start, time.perf_counter() - middle
    return results


# --------------------------------------------------------------------------- mechanism


def study_mechanism(
    config: BenchConfig,
    primary: dict[str, Any],
    weights: Weights,
    out: Path,
    track: Any,
    progress: bool = True,
    n_windows: int = 4,
) -> dict[str, Any]:
    """The trace identity and approximation quality on the primary arm's trained model.

    Takes the first evaluation seed's trained weights and, for contrast, the same member
    freshly initialised; feeds ``n_windows`` test windows; writes both studies to
    ``out/mechanism.json`` and returns the trained model's ``mechanism_signature``. An
    ``out/mechanism.json`` of the same run and options is read instead (no weights read).
    """
    result = read_run_file(weights.runs_dir / f"{primary['run_ids'][0]}.json")
    init = build_model(result["config"], track_config_of(result["config"]), torch.device("cpu"))
    arm = config.arm(config.decision.primary_arm)
    options = {
        k: arm.options[k] for k in ("pivot_set", "weighting", "tempering") if k in arm.options
    }
    x = config.task.inputs_targets(track, "test")[0][:n_windows]
    study_options = {**options, **(config.studies.mechanism or {})}
    seed = result["seeds"][0]
    described = (
        f"{arm.name} (method {arm.method}, options {dict(arm.options)}), lr "
        f"{result['lr']:g}, evaluation seed {seed}, run {result['run_id']}, "
        f"{len(x)} test {config.task.sample_unit}"
    )
    path = out / "mechanism.json"
    previous = read_json_or_heal(path, ("model", "options", "trained"))
    if previous is not None:  # resume: this model was studied with these options already
        if previous.get("model") == described and previous.get("options") == study_options:
            return {**previous["trained"]["mechanism_signature"], **trained_model(described)}
    trained, _ = weights.load(result["run_id"])
    studies = {}
    for name, model in (("trained", trained), ("init", init)):
        member0 = member0_attention_inputs(model, x)
        studies[name] = mechanism_study(member0, progress=progress, **study_options)
    signature = {**studies["trained"]["mechanism_signature"], **trained_model(described)}
    write_result_and_timings(
        path, {"model": described, "options": study_options, **studies}, TIMING_KEYS
    )
    return signature


def member0_attention_inputs(model: Any, x: Tensor) -> list[tuple[Tensor, Tensor, Tensor]]:
    """Every layer's attention (q, k, v), each (B, H, n, d), of a stacked model's member 0
    (its first seed) on inputs ``x`` (B, ...)."""
    qkv = model.attention_inputs(x.expand(model.n_members, *x.shape))
    return [tuple(t[: len(x)] for t in layer) for layer in qkv]


def trained_model(described: str) -> dict[str, Any]:
    """The signature's model keys: ``trained_model`` a boolean (the earlier check's type),
    the words beside it."""
    return {"trained_model": True, "trained_model_description": described}


# --------------------------------------------------------------------------- output error


def output_error_arms(config: BenchConfig, eval_of: dict[str, dict[str, Any]]) -> list[str]:
    """The arms whose trained models the output-error study reads: exact and every
    evaluated arm with a rank."""
    return [config.decision.baseline_arm] + [
        arm.name
        for arm in config.design.arms
        if arm.method != "exact" and arm.name in eval_of and "rank" in options_of(arm.method)
    ]


def output_error_current(
    config: BenchConfig, eval_of: dict[str, dict[str, Any]], previous: dict[str, Any] | None
) -> bool:
    """Whether the earlier report ``previous`` holds this bench's output-error study: the
    same definition, ranks and draws, on the same runs (each arm's first evaluation run)."""
    done = (previous or {}).get("output_error")
    if not done or (done["definition"], done["ranks"], done["seeds"]) != (
        OUTPUT_ERROR_DEFINITION,
        list(config.studies.output_error_ranks),
        OUTPUT_ERROR_SEEDS,
    ):
        return False
    assert previous is not None
    arms = previous["arms"]
    return all(
        name in arms and arms[name]["run_ids"][:1] == eval_of[name]["run_ids"][:1]
        for name in output_error_arms(config, eval_of)
    )


def study_output_errors(
    config: BenchConfig,
    eval_of: dict[str, dict[str, Any]],
    weights: Weights,
    track: Any,
    n_windows: int = 4,
) -> dict[str, Any]:
    """Every arm's attention output error against exact on trained Q/K, at several ranks.

    Ranks: ``config.studies.output_error_ranks`` plus the arm's own. Inputs: the arm's own trained
    model and the exact arm's (the Q/K softmax attention learned: one set for every
    method), member 0 (the first evaluation seed), ``n_windows`` test windows.
    """
    x = config.task.inputs_targets(track, "test")[0][:n_windows]
    exact_inputs = _trained_inputs(weights, eval_of[config.decision.baseline_arm], x)
    rows = []
    for arm in config.design.arms:
        if arm.method == "exact" or arm.name not in eval_of:
            continue
        if "rank" not in options_of(arm.method):
            continue  # a control without a rank (``mean``): nothing to approximate
        own = dict(arm.options).get("rank")
        ranks = sorted(set(config.studies.output_error_ranks) | ({own} if own else set()))
        own_inputs = _trained_inputs(weights, eval_of[arm.name], x)
        for label, qkv in (("own", own_inputs), ("exact", exact_inputs)):
            for row in method_output_errors(
                qkv, arm.method, dict(arm.options), ranks, OUTPUT_ERROR_SEEDS
            ):
                rows.append(
                    {"arm": arm.name, "method": arm.method, "inputs": label, "own_rank": own, **row}
                )
    return {
        "definition": OUTPUT_ERROR_DEFINITION,
        "ranks": list(config.studies.output_error_ranks),
        "n_windows": len(x),
        "seeds": OUTPUT_ERROR_SEEDS,
        "rows": rows,
    }


def _trained_inputs(
    weights: Weights, result: dict[str, Any], x: Tensor
) -> list[tuple[Tensor, Tensor, Tensor]]:
    """Member 0's attention inputs on ``x`` of the model an evaluation ``result`` trained."""
    model, _ = weights.load(result["run_ids"][0])
    return member0_attention_inputs(model, x)
