"""Track ``recall``'s words (``rpka.tracks.text``): its set-up, the query-accuracy columns,
the no-recall rows and line, its learnability verdict and its row of the README summary."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rpka.tracks.text import TrackText


@dataclass(frozen=True)
class RecallText(TrackText):
    """The recall track in words: ``accuracy_required`` is its bar (exact's query accuracy)
    and ``length_metrics`` the query errors at the longer lengths (``error_x<f>``)."""

    accuracy_required: float = 0.95
    length_metrics: tuple[str, ...] = ()

    def extra_columns(self, report: Mapping, values: Mapping[str, float]) -> dict[str, Any]:
        """Query accuracy at the training length and at each longer one."""
        return {
            f"accuracy{metric.removeprefix('error')}": 1 - values[metric]
            for metric in ("error", *self.length_metrics)
            if metric in values
        }

    def naive_rows(self, report: Mapping, split: str) -> list[tuple[str, dict[str, float]]]:
        names = {"chance": "chance (uniform value)", "in_context": "a value of the sequence"}
        rows = report["naive_baselines"]["predictors"]
        return [(names[key], dict(row[split])) for key, row in rows.items()]

    def reference_lines(self, report: Mapping, split: str) -> list[tuple[str, float, str]]:
        rows, metric = report["naive_baselines"]["predictors"], report["metric"]
        return [("a value of the sequence", rows["in_context"][split][metric], ":")]

    def learnability_text(self, report: Mapping) -> str:
        le = report["learnability"]
        met = self.bar_word(le)
        return (
            f"Exact attention's test query accuracy is {le['baseline_test_accuracy']:.1%} "
            f"(required ≥ {le['accuracy_required']:.0%}; guessing a value of the sequence "
            f"gives {le['in_context_accuracy']:.1%}): the learnability bar is {met}."
        )

    def summary_targets(self, report: Mapping) -> list[tuple[str, str, bool | None]]:
        le = report["learnability"]
        return [
            (
                f"recall learnable: exact ≥ {self.accuracy_required:.0%} query accuracy",
                f"{le['baseline_test_accuracy']:.1%}",
                le["met"],
            )
        ]

    def metric_label(self, metric: str) -> str:
        if metric == "nll":
            return "NLL at queries (nats)"
        if metric in self.length_metrics:
            return f"query error at {metric.removeprefix('error_x')}x the training length"
        return "query error (1 - accuracy)"

    def setup_text(self, report: Mapping, protocol: str) -> str:
        data, model, train = report["data"], report["config"]["model"], report["config"]["train"]
        previous = model.get("previous_tokens", 0)
        embeds = (
            f"each token also embeds the {previous} token(s) before it (Zoology's short "
            f"convolution), "
            if previous
            else ""
        )
        return (
            f"**Track `recall` (MQAR).** Sequences of {data['seq_len']} tokens "
            f"(vocabulary {data['vocab_size']}): {data['n_pairs']} key-value pairs, then "
            f"{data['n_queries']} of the keys again at random positions; the model must "
            f"predict each queried key's value. {data['n_train_sequences']} training, "
            f"{data['n_val_sequences']} validation and {data['n_test_sequences']} test "
            f"sequences, and as many validation and test sequences at "
            f"{' and '.join(f'{f}x' for f in data['length_factors'])} the length (the same "
            f"pairs and queries; learned positions up to {data['max_len']}, trained up to "
            f"{data['seq_len']}).\n\n"
            f"**Model `{report['model']}` in causal mode.** {model['n_layers']} pre-norm "
            f"causal layers, d_model {model['d_model']}, {model['n_heads']} heads, learned "
            f"positions, {embeds}tied output head; loss and metrics at the query positions only. "
            f"Adam, {train['epochs']} epochs, batch {train['batch_size']}, "
            f"{train['lr_schedule']} schedule.\n\n" + protocol
        )
