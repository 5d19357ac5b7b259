"""Track ``lm``'s words (``rpka.tracks.text``): its set-up, the floor and n-gram rows and
lines, the gap columns, its learnability verdict and its row of the README summary."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rpka.tracks.text import TrackText

LM_NAMES = {
    "floor": "floor: exact entropy of the source",
    "source_optimal": "source-optimal predictor (realised)",
}


@dataclass(frozen=True)
class LMText(TrackText):
    """The lm track in words: perplexity next to the exact floor and the n-gram models."""

    def naive_rows(self, report: Mapping, split: str) -> list[tuple[str, dict[str, float]]]:
        """The exact floor (a number of the source, the same on every split), the
        source-optimal predictor's realised loss and the n-gram models."""
        naive = report["naive_baselines"]
        rows = [(LM_NAMES["floor"], dict(naive["floor"]))]
        for key, predictor in naive["predictors"].items():
            if key.startswith("ngram_"):
                order = int(key.split("_")[1])
                label = f"n-gram, {order} token{'s' if order > 1 else ''} of context"
            else:
                label = LM_NAMES.get(key, key)
            rows.append((label, dict(predictor[split])))
        return rows

    def reference_lines(self, report: Mapping, split: str) -> list[tuple[str, float, str]]:
        """The exact floor and the bigram model."""
        metric, naive = report["metric"], report["naive_baselines"]
        return [
            ("exact floor", naive["floor"][metric], ":"),
            ("n-gram, 1 token", naive["predictors"]["ngram_1"][split][metric], "--"),
        ]

    def learnability_text(self, report: Mapping) -> str:
        le = report["learnability"]
        met = self.bar_word(le)
        base = report["arms"][report["baseline_arm"]]["full"]
        mean = (
            f"; the mean of the seeds' perplexities, the metric compared above, is "
            f"{base['mean']:.3f}"
            if report["metric"] == "perplexity"
            else ""
        )
        return (
            f"Exact attention's test perplexity as exp(mean NLL over seeds) "
            f"{le['baseline_test_perplexity']:.3f} (mean NLL {le['baseline_test_nll']:.4f} "
            f"nats{mean}) against the best n-gram model "
            f"(`{le['best_ngram']}`) {le['best_ngram_perplexity']:.3f} "
            f"({le['best_ngram_nll']:.4f} nats) and the exact floor "
            f"{le['floor_perplexity']:.3f} ({le['floor_nll']:.4f} nats): it closes "
            f"{le['gap_closed']:.0%} of the gap between the n-gram model and the floor "
            f"(required ≥ {le['gap_closed_required']:.0%}): the learnability bar is {met}."
        )

    def extra_columns(self, report: Mapping, values: Mapping[str, float]) -> dict[str, Any]:
        """The mean NLL (nats) and the gaps to the exact floor."""
        floor = report["naive_baselines"]["floor"]
        return {
            "NLL (nats)": values["nll"],
            "perplexity - floor": values["perplexity"] - floor["perplexity"],
            "NLL - floor (nats)": values["nll"] - floor["nll"],
        }

    def metric_label(self, metric: str) -> str:
        return "NLL (nats/token)" if metric == "nll" else metric

    def setup_text(self, report: Mapping, protocol: str) -> str:
        cfg, data = report["config"], report["data"]
        track, model, train = cfg["track"], cfg["model"], cfg["train"]
        return (
            f"**Track `lm`.** Token sequences from a seeded Markov source with copies: "
            f"{track['vocab_size']} content tokens from an order-{track['order']} Markov chain, "
            f"and copy markers (lags {data['copy_lags']}) after which the next "
            f"{track['copy_length']} tokens repeat the token that many positions back. Its "
            f"entropy is exact, so perplexity has a known floor. {data['n_train_sequences']} "
            f"training, {data['n_val_sequences']} validation and {data['n_test_sequences']} "
            f"test sequences of {data['seq_len']} tokens ({data['n_tokens']} token types).\n\n"
            f"**Model `{report['model']}` in causal mode.** A decoder of {model['n_layers']} "
            f"pre-norm causal layers, d_model {model['d_model']}, {model['n_heads']} heads, "
            f"learned positions, output head tied to the token embedding; it reads tokens "
            f"0..{data['seq_len'] - 2} and predicts 1..{data['seq_len'] - 1} (attention sees "
            f"{data['attention_tokens']} tokens). Cross-entropy, Adam, {train['epochs']} "
            f"epochs, batch {train['batch_size']}, {train['lr_schedule']} schedule.\n\n" + protocol
        )

    def result_notes(self, report: Mapping) -> str:
        """Track lm: every arm's test perplexity next to the exact floor, and the gaps."""
        floor = report["naive_baselines"]["floor"]
        rate = report["naive_baselines"]["entropy_rate"]
        parts = [
            f"`{arm}` {e['floor_gap']['perplexity_mean']:.3f} "
            f"(+{e['floor_gap']['perplexity_gap']:.3f}; NLL +{e['floor_gap']['nll_gap']:.4f} nats)"
            for arm, e in report["arms"].items()
        ]
        return (
            f"The source's exact perplexity floor for these sequences is {floor['perplexity']:.3f} "
            f"({floor['nll']:.4f} nats/token; stationary entropy rate {rate['nll']:.4f} nats, "
            f"perplexity {rate['perplexity']:.3f}). Mean of the seeds' test perplexities over "
            f"{report['n_seeds']} seeds (not exp of the mean NLL), with the gap to the floor: "
            + "; ".join(parts)
            + "."
        )

    def summary_targets(self, report: Mapping) -> list[tuple[str, str, bool | None]]:
        le = report["learnability"]
        return [
            (
                "lm learnable: exact closes ≥ 50 % of the n-gram-to-floor gap",
                f"{le['gap_closed']:.0%}",
                le["met"],
            )
        ]
