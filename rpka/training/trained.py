"""A finished run's weights: ``load_trained`` (the stacked model and its result) and
``load_run_state`` (the weights only), each checked against the checksum the run recorded
(``rpka.io.verify_state_file``), so a swapped or edited weights file is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from rpka.io import read_checked, read_run_file, verify_state_file
from rpka.training.train import build_model, track_config_of


def load_trained(run_file: str | Path, device: str = "cpu") -> tuple[nn.Module, dict]:
    """The trained stacked model of a finished run and its result.

    ``run_file`` is the run's JSON; the weights are the ``.pt`` file beside it (written when
    the run had a ``state_path``, as the bench's evaluation runs do), checked against the
    ``state_sha256`` the run recorded (:func:`load_run_state`).
    """
    run_file = Path(run_file)
    result = read_run_file(run_file)
    state = load_run_state(run_file, result, device)  # checked before a model is built
    run_config = {**result["config"], "device": device}
    model = build_model(run_config, track_config_of(run_config), torch.device(device))
    model.load_state_dict(state)
    return model.eval(), result


def load_run_state(
    run_file: str | Path, result: dict[str, Any] | None = None, device: str = "cpu"
) -> dict[str, Tensor]:
    """The saved weights of the finished run ``run_file`` (the ``.pt`` beside it), checked:
    they are the weights the run saved (their sha256 is the result's ``state_sha256``,
    :func:`rpka.io.verify_state_file`) and they load; else ``CorruptFileError`` naming the
    files. ``result``: the run's result if already read (:func:`rpka.io.read_run_file`)."""
    run_file = Path(run_file)
    state_file = run_file.with_suffix(".pt")
    if not state_file.exists():
        raise FileNotFoundError(
            f"{state_file} is missing: the run kept no weights (rerun it with a state_path)"
        )
    verify_state_file(state_file, read_run_file(run_file) if result is None else result, run_file)
    return read_checked(state_file, lambda path: load_state(path, device))


def load_state(path: str | Path, device: str = "cpu") -> dict[str, Tensor]:
    """A run's saved weights (``state_dict``), tensors only (``weights_only``: no pickled code)."""
    return torch.load(path, map_location=device, weights_only=True)
