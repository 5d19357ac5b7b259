"""The ``Task`` interface: what the study computes for one track - data, model and loss,
metrics, baselines - in one narrow class; its words are a separate part (``Task.text``).

The training loop (``rpka.training.train``), the bench (``rpka.bench``) and the report package
(``rpka.report``) are the same for every track; whatever differs is asked of the track's
:class:`Task`, looked up by name in ``rpka.tracks.TRACKS`` (the report carries the name
under ``"track"``). No code outside ``rpka/tracks/`` branches on a track's name.

A task has three groups of members:

* **data** - ``config_class`` (a frozen dataclass with a ``name`` field equal to the
  task's name, ``validate()`` and the property ``attention_tokens``), :meth:`load` (the
  track's data for a config), :meth:`inputs_targets` (model inputs and targets of a split),
  :meth:`data_summary` (the report's ``data`` block), ``sample_unit`` ("windows"),
  :meth:`at_context` (the config resized for the long-context study, ``rpka.study.longctx``),
  ``out_dir`` (the bench's results folder below ``data/results/<preset>``; "" for the
  primary track);
* **model, loss and metrics** - :meth:`build_model` (the stacked model of S seeds),
  ``causal`` (whether its attention is causal: non-causal studies such as the output-error
  study are skipped on causal tasks), :meth:`validate_bench` (what the track requires of a
  whole bench configuration), :meth:`loss`, and the metrics: ``metrics`` (default primary
  first; every metric is "lower is better"), additive float64 sums per batch
  (:meth:`error_sums`) finished once per split (:meth:`finish`);
* **baselines and the bar** - :meth:`naive_baselines` (reference predictors computed
  from the data), :meth:`learnability` (whether exact attention learned the task),
  :meth:`arm_extras` (keys added to an arm's report entry).

The report's words and figure hooks for a track - titles, labels, set-up and verdict
prose, the naive rows of its tables, the reference lines of its plots, the README
summary's rows - are the task's ``text``, a :class:`~rpka.tracks.text.TrackText`
(``rpka.tracks.get_text(name)``); a track without words of its own gets the defaults.

Adding a track is one module beside this one (a ``Task`` subclass, its config class and
data), one line in ``rpka/tracks/__init__.py`` and, optionally, its words; its presets go
to ``rpka.config.presets``. Shared code is in ``rpka.tracks.common`` (splits, standardisation, the
cached loader, :class:`~rpka.tracks.common.SeriesTask`: the forecast model, loss and naive
forecasts) and ``rpka.tracks.windows`` (tracks of one window per example: a
``WindowForecastTask`` sets only ``build_arrays``); a causal token task subclasses
``CausalTokenTask`` (below), as ``LMTask`` does. No track module imports another.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from torch import Tensor, nn

from rpka.attention import build
from rpka.checks import require
from rpka.tracks.text import TrackText


class Task:
    """The track-specific part of training and evaluation (see the module docstring)."""

    name: ClassVar[str]
    config_class: ClassVar[type]
    metrics: ClassVar[tuple[str, ...]]  # the default primary metric first; lower is better
    causal: ClassVar[bool] = False
    sample_unit: ClassVar[str] = "windows"
    out_dir: ClassVar[str] = ""  # below data/results/<preset>; "" for the primary track
    text: ClassVar[TrackText] = TrackText()  # the report's words (rpka.tracks.text)

    # ------------------------------------------------------------------ data
    def load(self, config: Any, data_dir: str | Path | None = None) -> Any:
        """The track's data for ``config`` (generated once, then read from the cache)."""
        raise NotImplementedError

    def inputs_targets(self, track: Any, split: str) -> tuple[Tensor, Tensor]:
        """Model inputs (N, ...) and targets (N, ...) of one split (``train``/``val``/``test``)."""
        raise NotImplementedError

    def data_summary(self, track: Any) -> dict[str, Any]:
        raise NotImplementedError

    def at_context(self, config: Any, context: int, train_windows: int, eval_windows: int) -> Any:
        """``config`` resized for the long-context study (``rpka.study.longctx``): ``context``
        tokens, ``train_windows`` training and ``eval_windows`` validation and test windows
        (per series on a track cut from series), validated. A track without a long-context
        form raises ``ValueError``."""
        raise ValueError(f"track {self.name!r} has no long-context form (Task.at_context)")

    # ------------------------------------------------------------------ model, loss, metrics
    def build_model(
        self, model: Any, track: Any, seeds: list[int], method: str, options: dict[str, Any]
    ) -> nn.Module:
        """The stacked model: ``model`` a ``ModelConfig``, ``track`` this task's config."""
        raise NotImplementedError

    def validate_bench(self, bench: Any) -> None:
        """What the track requires of a whole ``BenchConfig`` (nothing by default)."""

    def loss(self, pred: Tensor, y: Tensor) -> Tensor:
        """Training loss per member (S,) of a batch: ``pred`` from the model, ``y`` (S, B, ...)."""
        raise NotImplementedError

    def error_sums(self, pred: Tensor, y: Tensor) -> dict[str, Tensor]:
        """Additive float64 sums (S,) of a batch, ``y`` (B, ...) shared by the members."""
        raise NotImplementedError

    def count(self, y: Tensor) -> int:
        """How many terms a split's sums add up (``y``: the whole split's targets)."""
        return y.numel()

    def finish(self, sums: dict[str, Tensor], count: int) -> dict[str, Tensor]:
        """The metrics (S,) of a split from its sums, keyed as ``self.metrics``."""
        raise NotImplementedError

    # ------------------------------------------------------------------ baselines, the bar
    def naive_baselines(self, track: Any) -> dict[str, Any]:
        raise NotImplementedError

    def learnability(self, baseline: dict[str, Any], naive: dict[str, Any]) -> dict[str, Any]:
        """Whether the baseline arm (its report entry) learned the task."""
        raise NotImplementedError

    def arm_extras(self, entry: dict[str, Any], naive: dict[str, Any]) -> dict[str, Any]:
        """Track-specific keys added to an arm's report entry (none by default)."""
        return {}


def validate_causal_token_bench(bench: Any, track_name: str) -> None:
    """A causal decoder over tokens (tracks lm, recall): token embedding of width 1, no
    skip, and every arm buildable with causal attention."""
    require(
        bench.model.embed_kernel == 1 and not bench.model.linear_skip,
        f"model (track {track_name})",
        "embed_kernel=1 and linear_skip=False (a token embeds itself; no horizon skip)",
        (bench.model.embed_kernel, bench.model.linear_skip),
    )
    for arm in bench.arms:
        try:
            build(arm.method, causal=True, **arm.options)
        except ValueError as err:
            raise ValueError(f"arm {arm.name!r} cannot run on track {track_name}: {err}") from None


class CausalTokenTask(Task):
    """A causal decoder over token sequences (tracks ``lm`` and ``recall``): causal, its
    samples sequences, and a bench it can run (:func:`validate_causal_token_bench`)."""

    causal: ClassVar[bool] = True
    sample_unit: ClassVar[str] = "sequences"

    def validate_bench(self, bench: Any) -> None:
        validate_causal_token_bench(bench, self.name)
