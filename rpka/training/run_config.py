"""What one training run is: its configuration (:func:`make_run_config`, JSON-able: arm,
learning rate, seeds, split, track, model and training settings, device), the part of it
that can change its result (:func:`hashed_config`) and the run id hashed from that part
(:func:`run_id`, the name of its run file), its checks, and the seeds a run derives from
its members' seeds (:func:`derive_seed`). ``rpka.training.train`` runs it."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import torch

from rpka.config.bench import ArmConfig, BenchConfig
from rpka.io import config_hash
from rpka.tracks.cache import track_fields
from rpka.training.curriculum import WARM_START_KEY

SCORE_SPLITS = ("val", "test")
# keys of a run configuration that do not change its result (not hashed)
VOLATILE_KEYS = ("data_dir", "progress", "state_path")
# model options added after results were recorded: left out of the run id while at their
# default (the behaviour those results had), so that existing run files stay valid
LATER_MODEL_DEFAULTS = {"readout": "flatten"}
# independent random streams derived from one seed (numpy SeedSequence spawn keys): the
# initialisation, the data order, RPKA's pivots and (per-seed data, rpka.training.seed_data) the
# track's own data seed
STREAM_INIT, STREAM_DATA, STREAM_PIVOTS, STREAM_TRACK_DATA = 0, 1, 2, 3
# the run configuration's key of the per-seed data mode (rpka.training.seed_data): True, or absent
# (every member reads the track as configured: the committed studies keep their run ids)
DATA_PER_SEED_KEY = "data_per_seed"


def derive_seed(*entropy: int) -> int:
    """A 63-bit seed from integers, via ``numpy.random.SeedSequence`` (stable, well mixed)."""
    return int(np.random.SeedSequence(list(entropy)).generate_state(2, np.uint64)[0] >> 1)


def make_run_config(
    config: BenchConfig,
    arm: ArmConfig,
    lr: float,
    seeds: list[int] | tuple[int, ...],
    split: str,
    data_dir: str | None = None,
    progress: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The full, JSON-able configuration of one run (see :func:`train_run`); with
    ``warm_start`` {track} only where the study has a warm start (``rpka.training.curriculum``) and
    ``data_per_seed`` (True) only where each seed reads its own data
    (``rpka.training.seed_data``)."""
    warm_start = config.design.warm_start_track
    run_config = {
        "arm": {"name": arm.name, "method": arm.method, "options": dict(arm.options)},
        "lr": float(lr),
        "seeds": [int(s) for s in seeds],
        "split": split,
        "track": track_fields(config.design.track),
        "model": _asdict(config.design.model),
        "train": _asdict(config.design.train),
        "device": config.execution.device,
        "data_dir": data_dir,
        "progress": progress or {"enable": False},
    }
    if warm_start is not None:  # absent otherwise: cold runs keep their run ids
        run_config[WARM_START_KEY] = {"track": track_fields(warm_start)}
    if config.design.data_per_seed:  # absent otherwise: shared-data runs keep their run ids
        run_config[DATA_PER_SEED_KEY] = True
    return run_config


def _asdict(obj: Any) -> dict[str, Any]:
    return dataclasses.asdict(obj)


def hashed_config(run_config: dict[str, Any]) -> dict[str, Any]:
    """Everything in a run configuration that can change its result: what its run id
    hashes and its result file stores (``VOLATILE_KEYS`` and ``LATER_MODEL_DEFAULTS`` at
    their default left out)."""
    hashed = {k: v for k, v in run_config.items() if k not in VOLATILE_KEYS}
    hashed["model"] = {
        k: v
        for k, v in hashed["model"].items()
        if not (k in LATER_MODEL_DEFAULTS and v == LATER_MODEL_DEFAULTS[k])
    }
    return hashed


def run_id(run_config: dict[str, Any]) -> str:
    """Hash of everything in a run configuration that can change its result."""
    return config_hash(hashed_config(run_config))


def check_run_config(run_config: dict[str, Any]) -> None:
    """A run configuration has every key, a positive learning rate, distinct seeds, a split
    that is scored and a device that is there; else ValueError naming what is wrong."""
    missing = sorted(
        {"arm", "lr", "seeds", "split", "track", "model", "train", "device"} - set(run_config)
    )
    if missing:
        raise ValueError(f"run_config is missing {missing}")
    lr = run_config["lr"]
    if not (isinstance(lr, int | float) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a positive finite number, got {lr!r}")
    seeds = run_config["seeds"]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be a non-empty list of distinct integers, got {seeds!r}")
    if run_config["split"] not in SCORE_SPLITS:
        raise ValueError(f"split must be one of {SCORE_SPLITS}, got {run_config['split']!r}")
    if run_config["device"] == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' requested but CUDA is not available")
