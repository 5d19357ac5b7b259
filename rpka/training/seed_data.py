"""Data per seed (issue 40): each evaluation seed trains and is scored on its own draw of
the track, so that a study's intervals cover the draw of the data, not only training.

In the default mode every member of every run reads one data set, the track as configured
(its ``seed``: the committed studies). With ``data_per_seed`` on (``Design.data_per_seed``;
the run configuration's :data:`DATA_PER_SEED_KEY`, present only then, so the mode is part of
the run id and existing run ids are unchanged), member s of a run reads the track with
``seed = data_seed(seeds[s])`` - :func:`rpka.training.run_config.derive_seed` of the
member's seed on its own stream (:data:`rpka.training.run_config.STREAM_TRACK_DATA`), one
generator stream per seed. The data seed depends on the member's seed alone, not on the arm,
the learning rate, the context or the seeds it is stacked with, so:

* arms with the same evaluation seed see the same windows (the comparison stays paired);
* a seed stacked with others in one model (``seeds_per_job``) trains on its own windows,
  as it would alone - the stacked model indexes each member's own split
  (:func:`member_batch`), and scores each member on its own validation / test windows;
* a warm-started run's first stage (``rpka.training.curriculum``) draws the same seed's data at the
  shorter context (the key is carried to it).

Splits are then stacked per member: inputs (S, N, ...) and targets (S, N, ...) instead of
(N, ...) shared by the members.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from rpka.tracks import Task
from rpka.training.run_config import DATA_PER_SEED_KEY, STREAM_TRACK_DATA, derive_seed

SPLIT_NAMES = ("train", "val", "test")
DATA_SEED_FIELD = "seed"  # the track configuration's field a data seed replaces


def data_per_seed(run_config: dict[str, Any]) -> bool:
    """Whether a run's members each read their own data (:data:`DATA_PER_SEED_KEY`)."""
    return bool(run_config.get(DATA_PER_SEED_KEY, False))


def data_seed(seed: int) -> int:
    """The data seed of evaluation (or sweep) seed ``seed``: its own stream, stable."""
    return derive_seed(int(seed), STREAM_TRACK_DATA)


def has_data_seed(track_config: Any) -> bool:
    """Whether a track configuration draws its data from a ``seed`` field (generated)."""
    names = {f.name for f in dataclasses.fields(track_config)}
    return DATA_SEED_FIELD in names


def member_track(track_config: Any, seed: int) -> Any:
    """The track configuration member ``seed`` reads in the per-seed mode."""
    if not has_data_seed(track_config):
        raise ValueError(
            f"data_per_seed: track {track_config.name!r} has no 'seed' field to derive a "
            "data set per seed from (generated tracks only)"
        )
    return dataclasses.replace(track_config, **{DATA_SEED_FIELD: data_seed(seed)})


def member_tracks(track_config: Any, seeds: list[int]) -> list[Any]:
    """Every member's track configuration, in the order of ``seeds``."""
    return [member_track(track_config, s) for s in seeds]


def run_splits(
    run_config: dict[str, Any], task: Task, track_config: Any
) -> dict[str, tuple[Tensor, Tensor]]:
    """The run's (inputs, targets) per split: shared (N, ...) by every member, or in the
    per-seed mode stacked per member (S, N, ...), member s from its own data seed."""
    data_dir = run_config.get("data_dir")
    if not data_per_seed(run_config):
        track = task.load(track_config, data_dir)
        return {name: task.inputs_targets(track, name) for name in SPLIT_NAMES}
    tracks = [task.load(c, data_dir) for c in member_tracks(track_config, run_config["seeds"])]
    splits = {}
    for name in SPLIT_NAMES:
        xs, ys = zip(*(task.inputs_targets(t, name) for t in tracks), strict=True)
        splits[name] = (torch.stack(xs), torch.stack(ys))
    return splits


def member_batch(data: Tensor, batch: Tensor, per_member: bool) -> Tensor:
    """The windows ``batch`` (S, B) picks: from the shared split (N, ...), or in the
    per-seed mode each member's from its own split (S, N, ...)."""
    if not per_member:
        return data[batch]
    members = torch.arange(data.shape[0], device=batch.device).unsqueeze(1)
    return data[members, batch]


def n_windows(x: Tensor, per_member: bool) -> int:
    """The windows of a split (the same for every member in the per-seed mode)."""
    return x.shape[1] if per_member else x.shape[0]


def data_seeds_of(run_config: dict[str, Any]) -> list[int] | None:
    """The members' data seeds (per-seed mode), else None: for the run's record."""
    if not data_per_seed(run_config):
        return None
    return [data_seed(s) for s in run_config["seeds"]]


def naive_baselines_of(config: Any, track: Any, data_dir: str | None) -> dict[str, Any]:
    """The bench's naive forecasts (``Task.naive_baselines``): on ``track`` (the study's
    one data set), or in the per-seed mode averaged over the evaluation seeds' own data
    sets (each error a mean over equally many windows, so the average is the pooled
    error), with each seed's errors under ``per_seed`` and the mode under ``data``."""
    task = config.task
    if not config.design.data_per_seed:
        return task.naive_baselines(track)
    per_seed = {
        str(s): task.naive_baselines(task.load(member_track(config.design.track, s), data_dir))
        for s in config.design.eval_seeds
    }
    first = next(iter(per_seed.values()))
    forecasts = {
        name: {
            split: {
                metric: sum(p["forecasts"][name][split][metric] for p in per_seed.values())
                / len(per_seed)
                for metric in errors
            }
            for split, errors in splits.items()
        }
        for name, splits in first["forecasts"].items()
    }
    return first | {"forecasts": forecasts, "per_seed": per_seed, "data": "per seed (mean)"}


def tracks_to_cache(config: Any) -> list[Any]:
    """Every track configuration a bench's runs read (generated once, before the workers):
    the track and its warm-start track, or in the per-seed mode each of them per sweep and
    evaluation seed."""
    design = config.design
    shared = [t for t in (design.track, design.warm_start_track) if t is not None]
    if not design.data_per_seed:
        return shared
    seeds = sorted({*design.sweep_seeds, *design.eval_seeds})
    return [member_track(t, s) for t in shared for s in seeds]
