"""A curriculum over context lengths: train at a short context first, then at the run's own.

At 2,048 tokens the long-range task's evidence is sparse (8 occurrences in 2,048 steps) and
exact attention trained from scratch stays at the naive forecast within the budget; trained
first at 512 tokens, where the same model learns the lookup, and then at 2,048 it does
(docs/longctx.md). A run whose configuration has ``warm_start`` = {"track": <the same track
at a shorter context>} trains in two stages (``rpka.training.train.train_run``):

1. the *first stage*: the same arm, learning rate, seeds, model and training, on the short
   track - the run the short context's own bench trains (:func:`first_stage_config`);
2. the run itself, from the first stage's weights. Every weight but the learned positions
   is shared by all lengths (the embedding acts per token, attention and the last-token
   readout do not depend on the length); the positions (S, C_short, d) are stretched to
   (S, C, d) by linear interpolation along the length (:func:`stretched_state`), as
   position interpolation extends a trained model's context (Chen et al. 2023,
   arXiv:2306.15595).

The warm start is part of the run's configuration, so of its run id: a warm-started run
never resumes from a cold one's file.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

WARM_START_KEY = "warm_start"  # the run configuration's key: {"track": <track as a dict>}
POSITION_KEY = "position"  # the learned positions' parameter (rpka.model), (S, C, d)


def first_stage_config(run_config: dict[str, Any]) -> dict[str, Any]:
    """The first stage of a warm-started run: its configuration with the short track, scored
    on validation only, saving nothing (the second stage reads its weights in memory)."""
    first = {k: v for k, v in run_config.items() if k not in (WARM_START_KEY, "state_path")}
    return first | {"track": dict(run_config[WARM_START_KEY]["track"]), "split": "val"}


def stretched_state(state: dict[str, Tensor], target: dict[str, Tensor]) -> dict[str, Tensor]:
    """``state`` (a trained model's ``state_dict``) shaped for the model whose state is
    ``target``: learned positions (S, C_short, d) interpolated linearly to (S, C, d) with the
    end points kept (``align_corners``); every other tensor as it is. Any other shape that
    differs raises ``ValueError`` naming it (e.g. a flatten readout, whose weights grow with
    the context: use ``model.readout = "last"``)."""
    out = {}
    for name, value in state.items():
        want = target[name].shape
        if value.shape == want:
            out[name] = value
        elif name.split(".")[-1] == POSITION_KEY and value.shape[::2] == want[::2]:
            length_last = value.transpose(1, 2)  # (S, d, C_short): interpolate along the length
            longer = F.interpolate(length_last, size=want[1], mode="linear", align_corners=True)
            out[name] = longer.transpose(1, 2).contiguous()
        else:
            raise ValueError(
                f"warm_start: parameter {name!r} has shape {tuple(value.shape)} at the first "
                f"stage's context and {tuple(want)} at the run's; only the learned positions "
                "may differ (model.readout 'last', model.linear_skip off)"
            )
    return out


@torch.no_grad()
def load_stretched(model: torch.nn.Module, state: dict[str, Tensor]) -> None:
    """Load ``state`` into ``model``, its positions stretched to the model's context."""
    model.load_state_dict(stretched_state(state, model.state_dict()))
