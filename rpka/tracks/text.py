"""A track's words and figure hooks: the optional part of a track that the report reads.

A :class:`~rpka.tracks.base.Task` holds data, model, loss, metrics and baselines; what the
report, the README summary and the bench's printed table *say* about a track lives in its
:class:`TrackText`, the task's ``text`` (``rpka.tracks.get_text(name)``). A track without
words of its own gets :class:`TrackText`'s defaults: generic titles and labels, no
reference rows or lines. Every number in the words comes from the report dict.

* labels - ``title`` (the report's and the summary's section title), ``loss_label``,
  :meth:`~TrackText.metric_label`, :meth:`~TrackText.metric_short`;
* prose - :meth:`~TrackText.setup_text`, :meth:`~TrackText.learnability_text`,
  :meth:`~TrackText.result_notes`, :meth:`~TrackText.summary_targets` (the README
  summary's rows);
* tables and figures - :meth:`~TrackText.naive_rows` (the reference predictors' table
  rows), :meth:`~TrackText.reference_lines` (the lines plots draw),
  :meth:`~TrackText.extra_columns` (extra result-table columns).

:class:`SeriesText` holds the words every forecast-like track shares (MSE / MAE, the naive
forecasts) and :class:`WindowText` those of the window-per-example tracks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

NAIVE_NAMES = {
    "mean": "naive: context mean",
    "last_value": "naive: last value",
    "seasonal_naive": "naive: seasonal",
    "linear": "naive: linear (least squares)",
}


@dataclass(frozen=True)
class TrackText:
    """The words of a track without words of its own (see the module docstring)."""

    title: str = "Track"  # the report's and the summary's section title
    loss_label: str = "loss"

    def metric_label(self, metric: str) -> str:
        """A metric as an axis label, e.g. "MSE (standardised units)"."""
        return metric

    def metric_short(self, metric: str) -> str:
        """A metric in a short label, e.g. "MSE"."""
        return metric

    def setup_text(self, report: Mapping, protocol: str) -> str:
        """The track and model of a bench report in words, then ``protocol``."""
        return f"**Track `{report['track']}`.**\n\n" + protocol

    def learnability_text(self, report: Mapping) -> str:
        """The learnability verdict in words (Markdown), every number from the report."""
        return f"The learnability bar is {self.bar_word(report['learnability'])}."

    @staticmethod
    def bar_word(learnability: Mapping) -> str:
        """ "met" or "**not met**": a learnability block's verdict in the words' Markdown."""
        return "met" if learnability["met"] else "**not met**"

    def result_notes(self, report: Mapping) -> str:
        """What the track adds to its results in words (Markdown), or "" (the default)."""
        return ""

    def summary_targets(self, report: Mapping) -> list[tuple[str, str, bool | None]]:
        """(target, measured, met) rows of the README summary for this track's report."""
        le = report["learnability"]
        return [(f"{report['track']} learnable", "see the report", le["met"])]

    def naive_rows(self, report: Mapping, split: str) -> list[tuple[str, dict[str, float]]]:
        """The reference predictors as (label, {metric: value}) on ``split`` (none here)."""
        return []

    def reference_lines(self, report: Mapping, split: str) -> list[tuple[str, float, str]]:
        """(label, value, line style) of the references plots draw, in the report's metric."""
        return []

    def extra_columns(self, report: Mapping, values: Mapping[str, float]) -> dict[str, Any]:
        """Extra result-table columns of a row whose test means are ``values`` {metric: mean}."""
        return {}


@dataclass(frozen=True)
class SeriesText(TrackText):
    """A forecast over standardised windows: MSE and MAE, the four naive forecasts."""

    loss_label: str = "MSE (standardised units)"

    def metric_label(self, metric: str) -> str:
        return f"{metric.upper()} (standardised units)"

    def metric_short(self, metric: str) -> str:
        return metric.upper()

    def naive_rows(self, report: Mapping, split: str) -> list[tuple[str, dict[str, float]]]:
        forecasts = report["naive_baselines"]["forecasts"]
        return [(NAIVE_NAMES.get(k, k), dict(f[split])) for k, f in forecasts.items()]

    def reference_lines(self, report: Mapping, split: str) -> list[tuple[str, float, str]]:
        """The mean and linear forecasts."""
        metric, naive = report["metric"], report["naive_baselines"]
        return [
            (f"naive {key} ({split})", naive["forecasts"][key][split][metric], ls)
            for key, ls in (("mean", ":"), ("linear", "--"))
        ]


@dataclass(frozen=True)
class WindowText(SeriesText):
    """A window-per-example forecast track (``rpka.tracks.windows``): ``description`` is one
    sentence on its data, ``linear_ratio`` its bar (exact's test MSE at most that times the
    least-squares linear forecast's)."""

    description: str = ""
    linear_ratio: float = 1.0

    def learnability_text(self, report: Mapping) -> str:
        le = report["learnability"]
        met = self.bar_word(le)
        return (
            f"Exact attention's test MSE {le['baseline_test_mse']:.4f} is "
            f"{le['ratio_to_linear']:.3f} × the least-squares linear forecast "
            f"({le['linear_mse']:.4f}; required ≤ {le['linear_ratio_required']}): the "
            f"learnability bar is {met}."
        )

    def summary_targets(self, report: Mapping) -> list[tuple[str, str, bool | None]]:
        le = report["learnability"]
        return [
            (
                f"{report['track']} learnable: exact ≤ {self.linear_ratio} × linear",
                f"{le['ratio_to_linear']:.3f} × linear",
                le["met"],
            )
        ]

    def setup_text(self, report: Mapping, protocol: str) -> str:
        data, model, train = report["data"], report["config"]["model"], report["config"]["train"]
        return (
            f"**Track `{report['track']}`.** {self.description} Windows of context "
            f"{data['context']} and horizon {data['horizon']}, each standardised by its own "
            f"context: {data['n_train_windows']} training, {data['n_val_windows']} validation "
            f"and {data['n_test_windows']} test windows.\n\n"
            f"**Model `{report['model']}`.** {model['n_layers']} pre-norm encoder layers, "
            f"d_model {model['d_model']}, {model['n_heads']} heads, one token per time step "
            f"embedding its {model['embed_kernel']} neighbouring values (attention sees "
            f"{data['context']} tokens), a linear context-to-horizon skip. Adam, "
            f"{train['epochs']} epochs, batch {train['batch_size']}, {train['lr_schedule']} "
            f"schedule.\n\n" + protocol
        )
