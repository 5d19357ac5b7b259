"""The ``forecast`` track's words (``rpka.tracks.text``): its set-up, its learnability
verdict and its rows of the README summary (the bar and the training-step targets)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rpka.tracks.text import SeriesText

# training step against exact's at the forecast's length (issue 16's table)
STEP_TARGETS = {"rpka-r16": 1.5, "rpka-r64": 3.0}


@dataclass(frozen=True)
class ForecastText(SeriesText):
    """The forecast track in words (its labels and naive rows are ``SeriesText``'s)."""

    def learnability_text(self, report: Mapping) -> str:
        le = report["learnability"]
        met = self.bar_word(le)
        return (
            f"Exact attention's test MSE {le['baseline_test_mse']:.4f} is "
            f"{le['ratio_to_better_naive']:.2f} × the better of the mean and last-value "
            f"forecasts (required ≤ {le['ratio_required']}) and {le['ratio_to_linear']:.3f} × "
            f"the least-squares linear forecast ({le['linear_mse']:.4f}; required ≤ 1): the "
            f"learnability bar is {met}."
        )

    def setup_text(self, report: Mapping, protocol: str) -> str:
        data, model, train = report["data"], report["config"]["model"], report["config"]["train"]
        return (
            f"**Track `{report['track']}`.** Synthetic univariate series from a seeded "
            f"generator (daily season with multiplicative weekly modulation, regimes with "
            f"their own oscillations, level jumps, AR(1) noise and trend). Windows of context "
            f"{data['context']} and horizon {data['horizon']}, each standardised by its own "
            f"context: {data['n_train_windows']} training, {data['n_val_windows']} validation "
            f"and {data['n_test_windows']} test windows, split chronologically.\n\n"
            f"**Model `{report['model']}`.** {model['n_layers']} pre-norm encoder layers, "
            f"d_model {model['d_model']}, {model['n_heads']} heads, one token per time step "
            f"(attention sees {data['context']} tokens), a linear context-to-horizon skip. "
            f"Adam, {train['epochs']} epochs, batch {train['batch_size']}, "
            f"{train['lr_schedule']} schedule.\n\n" + protocol
        )

    def summary_targets(self, report: Mapping) -> list[tuple[str, str, bool | None]]:
        le = report["learnability"]
        ratios = report["timings"]["step_ratio_vs_baseline"]
        steps = [
            (
                f"{report['track']} track: {arm} training step at "
                f"{report['config']['track']['context']} tokens ≤ {bound} × exact",
                f"{ratios[arm]:.2f} ×",
                ratios[arm] <= bound,
            )
            for arm, bound in STEP_TARGETS.items()
            if arm in ratios
        ]
        return [
            (
                "forecast learnable: exact ≤ 0.6 × better naive, ≤ linear",
                f"{le['ratio_to_better_naive']:.3f} ×; {le['ratio_to_linear']:.3f} × linear",
                le["met"],
            ),
            *steps,
        ]
