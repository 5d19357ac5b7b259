"""What the bench trains and scores on each track: model, loss, metrics, baselines, bar.

The training loop (``rpka.train``) and the bench (``rpka.bench``) are the same for every
track; what differs is collected here, one class per track, chosen by the track's name
(:func:`task_of`):

* ``forecast`` (:class:`ForecastTask`): ``TransformerTiny`` maps a standardised context
  (S, B, L) to a horizon (S, B, H); loss = mean squared error; metrics MSE and MAE; the
  naive forecasts of ``rpka.tracks.baselines``; learnability = beating them by a margin.
* ``lm`` (:class:`LMTask`): the causal decoder ``TransformerLM`` reads tokens 0..L-2 and
  predicts 1..L-1; loss = cross-entropy (nats); metrics the mean negative log-likelihood
  per predicted token ``NLL = -(1/N) sum log p(x_t | x_<t)`` and the perplexity
  ``exp(NLL)``, per member over the whole split (so the perplexity of a split is that of
  its pooled tokens, not a mean of per-sequence perplexities); baselines the exact floor,
  the source-optimal predictor and n-gram models; learnability = exact attention closing
  at least half of the gap between the best n-gram model and the floor.

Every metric is "lower is better". Additive sums are accumulated in float64 over
evaluation batches (:meth:`Task.error_sums`) and finished once (:meth:`Task.finish`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rpka.model import TransformerLM, TransformerTiny
from rpka.presets import METRICS, LMConfig, ModelConfig, TrackConfig
from rpka.tracks.baselines import naive_baselines
from rpka.tracks.lm import LMTrack, MarkovCopySource, ngram_baseline_nats

# learnability bar (issue 3): exact attention's mean test MSE must be at most this times
# the better of the mean and last-value forecasts, and no worse than the linear forecast
LEARNABILITY_RATIO = 0.6
# learnability bar of track lm: exact attention must close at least this fraction of the
# gap between the best n-gram model and the exact floor (test NLL, nats)
LM_GAP_CLOSED_REQUIRED = 0.5
# n-gram baselines of track lm: context lengths (an order-k model conditions on k tokens)
NGRAM_ORDERS = (1, 2)


class Task:
    """The track-specific part of training and reporting (see the module docstring)."""

    name: str

    @property
    def metrics(self) -> tuple[str, ...]:
        return METRICS[self.name]

    def build_model(
        self,
        model: ModelConfig,
        track: Any,
        seeds: list[int],
        method: str,
        options: dict[str, Any],
    ) -> nn.Module:
        raise NotImplementedError

    def inputs_targets(self, track: Any, split: str) -> tuple[Tensor, Tensor]:
        """Model inputs (N, ...) and targets (N, ...) of one split (``train``/``val``/``test``)."""
        raise NotImplementedError

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

    def naive_baselines(self, track: Any) -> dict[str, Any]:
        raise NotImplementedError

    def learnability(self, baseline: dict[str, Any], naive: dict[str, Any]) -> dict[str, Any]:
        """Whether the baseline arm (its report entry) learned the task."""
        raise NotImplementedError

    def data_summary(self, track: Any) -> dict[str, Any]:
        raise NotImplementedError

    def arm_extras(self, entry: dict[str, Any], naive: dict[str, Any]) -> dict[str, Any]:
        """Track-specific keys added to an arm's report entry (none by default)."""
        return {}


# ----------------------------------------------------------------------------- forecast


class ForecastTask(Task):
    name = "forecast"

    def build_model(self, model, track: TrackConfig, seeds, method, options) -> nn.Module:
        return TransformerTiny(model, track.context, track.horizon, seeds, method, options)

    def inputs_targets(self, track: Any, split: str) -> tuple[Tensor, Tensor]:
        data = track.split(split)
        return data.x, data.y

    def loss(self, pred: Tensor, y: Tensor) -> Tensor:
        return (pred - y).pow(2).mean((1, 2))

    def error_sums(self, pred: Tensor, y: Tensor) -> dict[str, Tensor]:
        diff = (pred - y).double()
        return {"mse": diff.pow(2).sum((1, 2)), "mae": diff.abs().sum((1, 2))}

    def finish(self, sums: dict[str, Tensor], count: int) -> dict[str, Tensor]:
        return {"mse": sums["mse"] / count, "mae": sums["mae"] / count}

    def naive_baselines(self, track: Any) -> dict[str, Any]:
        return naive_baselines(track)

    def learnability(self, baseline: dict[str, Any], naive: dict[str, Any]) -> dict[str, Any]:
        return forecast_learnability(baseline["full_by_metric"]["mse"]["mean"], naive)

    def data_summary(self, track: Any) -> dict[str, Any]:
        return {
            "n_train_windows": len(track.train),
            "n_val_windows": len(track.val),
            "n_test_windows": len(track.test),
            "context": track.config.context,
            "horizon": track.config.horizon,
        }


def forecast_learnability(baseline_mean: float, naive: dict[str, Any]) -> dict[str, Any]:
    """The issue's bar: exact <= 0.6 x min(mean, last value) and <= linear (test MSE)."""
    test = {name: f["test"]["mse"] for name, f in naive["forecasts"].items()}
    better_naive = min(test["mean"], test["last_value"])
    threshold = LEARNABILITY_RATIO * better_naive
    meets_ratio = bool(baseline_mean <= threshold)
    meets_linear = bool(baseline_mean <= test["linear"])
    return {
        "baseline_test_mse": baseline_mean,
        "mean_forecast_mse": test["mean"],
        "last_value_mse": test["last_value"],
        "seasonal_naive_mse": test["seasonal_naive"],
        "linear_mse": test["linear"],
        "ratio_required": LEARNABILITY_RATIO,
        "threshold": threshold,
        "ratio_to_better_naive": baseline_mean / better_naive,
        "ratio_to_linear": baseline_mean / test["linear"],
        "meets_ratio": meets_ratio,
        "meets_linear": meets_linear,
        "met": meets_ratio and meets_linear,
    }


# ----------------------------------------------------------------------------- lm


class LMTask(Task):
    name = "lm"

    def build_model(self, model, track: LMConfig, seeds, method, options) -> nn.Module:
        return TransformerLM(model, track.n_tokens, track.attention_tokens, seeds, method, options)

    def inputs_targets(self, track: LMTrack, split: str) -> tuple[Tensor, Tensor]:
        tokens = torch.from_numpy(track.split(split)).long()
        return tokens[:, :-1], tokens[:, 1:]  # inputs 0..L-2 predict 1..L-1

    @staticmethod
    def token_nll(logits: Tensor, y: Tensor) -> Tensor:
        """-log p(y) per token: logits (S, B, n, V), y (S or 1, B, n) -> (S, B, n)."""
        targets = y.expand(logits.shape[:-1])
        flat = F.cross_entropy(logits.flatten(0, 2), targets.flatten(), reduction="none")
        return flat.view(targets.shape)

    def loss(self, pred: Tensor, y: Tensor) -> Tensor:
        return self.token_nll(pred, y).mean((1, 2))  # cross-entropy per member (nats)

    def error_sums(self, pred: Tensor, y: Tensor) -> dict[str, Tensor]:
        return {"nll": self.token_nll(pred.double(), y.unsqueeze(0)).sum((1, 2))}

    def finish(self, sums: dict[str, Tensor], count: int) -> dict[str, Tensor]:
        nll = sums["nll"] / count
        return {"perplexity": nll.exp(), "nll": nll}

    def naive_baselines(self, track: LMTrack) -> dict[str, Any]:
        return lm_baselines(track)

    def learnability(self, baseline: dict[str, Any], naive: dict[str, Any]) -> dict[str, Any]:
        return lm_learnability(baseline["full_by_metric"]["nll"]["mean"], naive)

    def data_summary(self, track: LMTrack) -> dict[str, Any]:
        config = track.config
        return {
            "n_train_sequences": len(track.train),
            "n_val_sequences": len(track.val),
            "n_test_sequences": len(track.test),
            "seq_len": config.seq_len,
            "attention_tokens": config.attention_tokens,
            "n_tokens": config.n_tokens,
            "copy_lags": list(config.lags),
            "tokens_per_split": {
                s: int(track.split(s).shape[0] * config.attention_tokens)
                for s in ("train", "val", "test")
            },
        }

    def arm_extras(self, entry: dict[str, Any], naive: dict[str, Any]) -> dict[str, Any]:
        return {"floor_gap": floor_gap(entry, naive)}


def source_optimal_nats(track: LMTrack, split: str) -> float:
    """Realised mean loss of the Bayes-optimal predictor (the source itself) on a split."""
    return float(-MarkovCopySource(track.config).log_probs(track.split(split))[:, 1:].mean())


def _nats(value: float) -> dict[str, float]:
    return {"nll": value, "perplexity": math.exp(value)}


def lm_baselines(track: LMTrack, splits: tuple[str, ...] = ("val", "test")) -> dict[str, Any]:
    """The floor and the reference predictors of track ``lm``, in nats and perplexity.

    ``floor``: the exact expected loss of the best predictor of tokens 1..L-1 (the
    perplexity floor ``exp(floor)``); ``entropy_rate``: the stationary rate it tends to.
    ``predictors``: ``source_optimal`` (the source's own conditional probabilities on the
    split: the floor's realised value) and ``ngram_<k>`` (add-one-smoothed n-gram models
    with k tokens of context, fit on train; without long context they cannot copy). The
    n-gram losses average positions k..L-1; every other number positions 1..L-1.
    """
    n_tokens = track.config.n_tokens
    predictors: dict[str, dict[str, dict[str, float]]] = {
        "source_optimal": {s: _nats(source_optimal_nats(track, s)) for s in splits}
    }
    for order in NGRAM_ORDERS:
        predictors[f"ngram_{order}"] = {
            s: _nats(ngram_baseline_nats(track.train, track.split(s), n_tokens, order))
            for s in splits
        }
    return {
        "floor": _nats(track.floor_nats),
        "entropy_rate": _nats(track.entropy_rate_nats),
        "ngram_orders": list(NGRAM_ORDERS),
        "predictors": predictors,
    }


def lm_learnability(baseline_nll: float, naive: dict[str, Any]) -> dict[str, Any]:
    """Exact attention against the best n-gram model and the floor (test NLL, nats).

    ``gap_closed = (ngram - baseline) / (ngram - floor)``: 0 = no better than an n-gram
    model, 1 = at the floor. The bar: at least ``LM_GAP_CLOSED_REQUIRED``.
    """
    ngrams = {k: v["test"]["nll"] for k, v in naive["predictors"].items() if k.startswith("ngram")}
    best = min(ngrams, key=ngrams.get)
    ngram, floor = ngrams[best], naive["floor"]["nll"]
    gap_closed = (ngram - baseline_nll) / (ngram - floor)
    return {
        "baseline_test_nll": baseline_nll,
        "baseline_test_perplexity": math.exp(baseline_nll),
        "best_ngram": best,
        "best_ngram_nll": ngram,
        "best_ngram_perplexity": math.exp(ngram),
        "floor_nll": floor,
        "floor_perplexity": math.exp(floor),
        "gap_closed": gap_closed,
        "gap_closed_required": LM_GAP_CLOSED_REQUIRED,
        "met": bool(gap_closed >= LM_GAP_CLOSED_REQUIRED),
    }


def floor_gap(entry: dict[str, Any], naive: dict[str, Any]) -> dict[str, Any]:
    """An arm's test perplexity and NLL next to the floor: the gaps (arm - floor)."""
    floor = naive["floor"]
    ppl = entry["full_by_metric"]["perplexity"]
    nll = entry["full_by_metric"]["nll"]
    per_seed = [
        None if v is None or not np.isfinite(v) else v - floor["nll"] for v in nll["per_seed"]
    ]
    return {
        "floor_perplexity": floor["perplexity"],
        "floor_nll": floor["nll"],
        "perplexity_mean": ppl["mean"],
        "perplexity_gap": ppl["mean"] - floor["perplexity"],
        "perplexity_ratio": ppl["mean"] / floor["perplexity"],
        "nll_mean": nll["mean"],
        "nll_gap": nll["mean"] - floor["nll"],
        "nll_gap_per_seed": per_seed,
    }


# ----------------------------------------------------------------------------- lookup

TASKS: dict[str, Task] = {"forecast": ForecastTask(), "lm": LMTask()}


def task_of(track_name: str) -> Task:
    """The :class:`Task` of the track named ``track_name``."""
    if track_name not in TASKS:
        raise ValueError(f"track must be one of {sorted(TASKS)}, got {track_name!r}")
    return TASKS[track_name]
