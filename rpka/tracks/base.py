"""The ``Task`` interface: everything the study knows about one track, in one class.

The training loop (``rpka.train``), the bench (``rpka.bench``) and the report package
(``rpka.report``: its tables, figures, narrative and README block) are the same for
every track; whatever differs is asked of the track's :class:`Task`, looked up by name in
``rpka.tracks.TRACKS`` (the report carries the name under ``"track"``). No code outside
``rpka/tracks/`` branches on a track's name.

A task has four groups of members:

* **data** - ``config_class`` (a frozen dataclass with a ``name`` field equal to the
  task's name, ``validate()`` and the property ``attention_tokens``), :meth:`load` (the
  track's data for a config), :meth:`inputs_targets` (model inputs and targets of a split),
  :meth:`data_summary` (the report's ``data`` block), ``sample_unit`` ("windows"),
  :meth:`at_context` (the config resized for the long-context study, ``rpka.longctx``);
* **model and loss** - :meth:`build_model` (the stacked model of S seeds), ``causal``
  (whether its attention is causal: non-causal studies such as the output-error study
  are skipped on causal tasks), :meth:`validate_bench` (what the track requires of a whole
  bench configuration), :meth:`loss`, and the metrics: ``metrics`` (default primary
  first; every metric is "lower is better"), additive float64 sums per batch
  (:meth:`error_sums`) finished once per split (:meth:`finish`);
* **baselines and the bar** - :meth:`naive_baselines` (reference predictors computed
  from the data), :meth:`naive_rows` (their table rows), :meth:`reference_lines` (the
  lines plots draw), :meth:`learnability` (whether exact attention learned the task) and
  :meth:`learnability_text`, :meth:`arm_extras` (keys added to an arm's report entry),
  :meth:`extra_columns` (extra result-table columns);
* **words** - :meth:`metric_label`, :meth:`metric_short`, ``loss_label``, ``title``,
  :meth:`setup_text`, :meth:`result_notes`, ``out_dir`` (the bench's results folder below
  ``data/results/<preset>``; "" for the primary track) and :meth:`summary_targets` (the
  README summary's rows).

Adding a track is one module beside this one (a ``Task`` subclass, its config class and
data) and one line in ``rpka/tracks/__init__.py``; its presets go to ``rpka.presets``.
A forecast-like track with another generator or input embedding subclasses
``ForecastTask`` and overrides :meth:`load` (and :meth:`build_model`); a track of one
window per example subclasses ``WindowForecastTask`` (``rpka.tracks.windows``) and sets
only ``build_arrays``, loaded by the one ``load_windows``; a causal token task subclasses
``CausalTokenTask`` (below), as ``LMTask`` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from torch import Tensor, nn

from rpka.attention import build
from rpka.checks import require


class Task:
    """The track-specific part of training and reporting (see the module docstring)."""

    name: ClassVar[str]
    config_class: ClassVar[type]
    metrics: ClassVar[tuple[str, ...]]  # the default primary metric first; lower is better
    causal: ClassVar[bool] = False
    sample_unit: ClassVar[str] = "windows"
    loss_label: ClassVar[str] = "loss"
    out_dir: ClassVar[str] = ""  # below data/results/<preset>; "" for the primary track
    title: ClassVar[str] = "Track"  # the report's and the summary's section title

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
        """``config`` resized for the long-context study (``rpka.longctx``): ``context``
        tokens, ``train_windows`` training and ``eval_windows`` validation and test windows
        (per series on a track cut from series), validated. A track without a long-context
        form raises ``ValueError``."""
        raise ValueError(f"track {self.name!r} has no long-context form (Task.at_context)")

    # ------------------------------------------------------------------ model and loss
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

    # ------------------------------------------------------------------ baselines, bar
    def naive_baselines(self, track: Any) -> dict[str, Any]:
        raise NotImplementedError

    def naive_rows(self, report: Mapping, split: str) -> list[tuple[str, dict[str, float]]]:
        """The reference predictors as (label, {metric: value}) on ``split``."""
        raise NotImplementedError

    def reference_lines(self, report: Mapping, split: str) -> list[tuple[str, float, str]]:
        """(label, value, line style) of the references plots draw, in the report's metric."""
        return []

    def learnability(self, baseline: dict[str, Any], naive: dict[str, Any]) -> dict[str, Any]:
        """Whether the baseline arm (its report entry) learned the task."""
        raise NotImplementedError

    def learnability_text(self, report: Mapping) -> str:
        """The learnability verdict in words (Markdown), every number from the report."""
        raise NotImplementedError

    @staticmethod
    def bar_word(learnability: Mapping) -> str:
        """"met" or "**not met**": a learnability block's verdict in the words' Markdown."""
        return "met" if learnability["met"] else "**not met**"

    def arm_extras(self, entry: dict[str, Any], naive: dict[str, Any]) -> dict[str, Any]:
        """Track-specific keys added to an arm's report entry (none by default)."""
        return {}

    def extra_columns(self, report: Mapping, values: Mapping[str, float]) -> dict[str, Any]:
        """Extra result-table columns of a row whose test means are ``values`` {metric: mean}."""
        return {}

    # ------------------------------------------------------------------ words
    def metric_label(self, metric: str) -> str:
        """A metric as an axis label, e.g. "MSE (standardised units)"."""
        return metric

    def metric_short(self, metric: str) -> str:
        """A metric in a short label, e.g. "MSE"."""
        return metric

    def setup_text(self, report: Mapping, protocol: str) -> str:
        """The track and model of a bench report in words, then ``protocol``."""
        raise NotImplementedError

    def result_notes(self, report: Mapping) -> str:
        """What the track adds to its results in words (Markdown), or "" (the default)."""
        return ""

    def summary_targets(self, report: Mapping) -> list[tuple[str, str, bool | None]]:
        """(target, measured, met) rows of the README summary for this track's report."""
        le = report["learnability"]
        return [(f"{self.name} learnable", "see the report", le["met"])]


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
