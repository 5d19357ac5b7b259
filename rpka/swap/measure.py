"""The audit: what swapping a model's SDPA calls costs, per call site (issue 42 items 2, 5).

:func:`audit` runs the model once with exact attention and once per (method, rank) under
:func:`rpka.swap.sdpa.swap`, each run from the same seed (the global RNG is forked, so the
caller's is left as it was), and records per call site - the innermost module whose
forward made the SDPA call (forward hooks on every submodule), or ``call <i>`` - :

* ``output_error``: each swapped call's output against exact SDPA on the *same* inputs
  (float64), ``|O_hat - O|_F / |O|_F`` per (batch item, head), averaged over items, heads
  and the site's calls - the number ``rpka.study.dropin`` reports as ``output_error``;
* ``swapped``: the share of the site's calls the method served (the rest ran exact
  attention, ``fallback="exact"``);
* ``logit_std``: the spread of the exact run's logits ``scale * q.k`` at the site (first
  ``LOGIT_ITEMS`` batch items, visible pairs only) - sharp heads need higher ranks;
* ``rho``, ``predicted_rank``, ``error_at_predicted``: the rank law (``rpka.rank_law``,
  docs/rank_law.md "Law v2") at the site in the exact run: ``rho`` the largest head's
  ``rho_bound`` (max ||q_i|| max ||k_j - k_bar|| / sqrt(d) over the first ``LOGIT_ITEMS``
  items, the call's scale folded into q); ``predicted_rank`` the rank the method's fitted law
  predicts for an output error ``law_eps``, the largest over the site's heads (one rank
  serves every head of a call) and calls; ``error_at_predicted`` the method run at that rank
  on the exact run's inputs at the site, measured as ``output_error`` is (NaN where the
  method has no fit, or did not serve the call);
* ``metric`` / ``metric_change``: the caller's end metric on the swapped run and its
  change from exact's; ``model_output_error``: the model's output against exact's;
* ``forward_cpu_s`` / ``forward_ratio`` and ``site_cpu_s`` / ``site_ratio``: CPU time of
  the whole forward and of the site's SDPA calls, swapped against exact, measured with the
  package's protocol: every variant in turn in each round (interleaved, so a busy machine
  slows all alike), a warm-up round first, the median of ``repeats`` rounds, process CPU
  seconds.

A model that made no SDPA call is refused, never reported as zeros.
"""

from __future__ import annotations

import math
import statistics
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from matplotlib.figure import Figure
from torch import Tensor, nn

from rpka import rank_law
from rpka.swap.calls import (
    Law,
    law_columns,
    law_of,
    logit_std,
    reference,
    relative_error,
    seeded,
)
from rpka.swap.sdpa import CallRecord, SDPASwap, SwapRefused

NO_CALL = (
    "the model made no SDPA call (torch.nn.functional.scaled_dot_product_attention): a "
    "fused fast path? nn.TransformerEncoder / nn.MultiheadAttention in eval mode under "
    "no_grad take one - audit the model in train mode with dropout=0, or call "
    "MultiheadAttention with need_weights=False; code that imported the function by name "
    "before the swap is not reached either"
)
Metric = Callable[[Any], float | Tensor]


class SiteTracker:
    """Names the innermost module of ``model`` whose forward is running (its path in
    ``named_modules``, ``<model>`` for the root): forward hooks on every submodule while
    entered."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.stack: list[str] = []
        self.handles: list[Any] = []

    def __enter__(self) -> SiteTracker:
        for name, module in self.model.named_modules():
            label = name or "<model>"
            self.handles.append(module.register_forward_pre_hook(self._push(label)))
            self.handles.append(module.register_forward_hook(self._pop, always_call=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        self.stack.clear()

    def _push(self, label: str) -> Callable[..., None]:
        def hook(*_: object) -> None:
            self.stack.append(label)

        return hook

    def _pop(self, *_: object) -> None:
        if self.stack:
            self.stack.pop()

    def __call__(self) -> str | None:
        return self.stack[-1] if self.stack else None


def run_model(model: nn.Module, batch: Any) -> Any:
    """``model(batch)``; a tuple or list is unpacked as positional arguments, a mapping as
    keyword arguments."""
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, tuple | list):
        return model(*batch)
    return model(batch)


def _device_of(batch: Any) -> torch.device:
    tensors = (
        [batch]
        if isinstance(batch, Tensor)
        else list(batch.values() if isinstance(batch, Mapping) else batch)
    )
    return next((t.device for t in tensors if isinstance(t, Tensor)), torch.device("cpu"))


class Pass:
    """One run of the model under a swap, with each call's site, error and logit spread
    (and, in the exact run given a :class:`Law`, the law's columns)."""

    def __init__(
        self, swapper: SDPASwap, tracker: SiteTracker, exact: bool, law: Law | None = None
    ) -> None:
        self.swapper, self.exact, self.law = swapper, exact, law
        swapper.site, swapper.observer = tracker, self.observe
        self.errors: dict[str, list[float]] = defaultdict(list)
        self.spreads: dict[str, list[float]] = defaultdict(list)

    def observe(
        self, record: CallRecord, q: Tensor, k: Tensor, v: Tensor, args: dict, out: Tensor
    ) -> None:
        if self.exact:
            self.spreads[record.site].append(logit_std(q, k, args))
            if self.law is not None:
                self.law.observe(record.site, q, k, v, args, reference(self.swapper, q, k, v, args))
        elif record.swapped:
            self.errors[record.site].append(
                relative_error(out, reference(self.swapper, q, k, v, args))
            )

    def run(self, model: nn.Module, batch: Any, seed: int) -> Any:
        with seeded(seed, _device_of(batch)), torch.no_grad(), self.swapper:
            return run_model(model, batch)


def per_site(records: Sequence[CallRecord]) -> dict[str, dict[str, float]]:
    """Per site, in order of first call: calls, share swapped, CPU seconds of its calls."""
    sites: dict[str, dict[str, float]] = {}
    for r in records:
        site = sites.setdefault(r.site, {"calls": 0, "swapped": 0, "cpu_s": 0.0})
        site["calls"] += 1
        site["swapped"] += r.swapped
        site["cpu_s"] += r.cpu_s
    for site in sites.values():
        site["swapped"] /= site["calls"]
    return sites


def interleaved_times(
    model: nn.Module,
    batch: Any,
    variants: Sequence[Callable[[], SDPASwap]],
    tracker: SiteTracker,
    repeats: int,
    seed: int,
) -> list[tuple[float, dict[str, float]]]:
    """Per variant: the median CPU seconds of a forward and of each site's calls over
    ``repeats`` rounds, each round running every variant in turn after a warm-up round."""
    totals: list[list[float]] = [[] for _ in variants]
    sites: list[dict[str, list[float]]] = [defaultdict(list) for _ in variants]
    for round_ in range(repeats + 1):
        for i, make in enumerate(variants):
            swapper = make()
            swapper.site = tracker
            with seeded(seed, _device_of(batch)), torch.no_grad(), swapper:
                start = time.process_time()
                run_model(model, batch)
                seconds = time.process_time() - start
            if round_ == 0:
                continue  # warm-up: first-call costs (allocator, numba, caches)
            totals[i].append(seconds)
            for site, stats in per_site(swapper.records or []).items():
                sites[i][site].append(stats["cpu_s"])
    return [
        (statistics.median(t), {s: statistics.median(v) for s, v in site.items()})
        for t, site in zip(totals, sites, strict=True)
    ]


def _scalar(metric: Metric | None, output: Any) -> float:
    if metric is None:
        return math.nan
    value = metric(output)
    return float(value.item() if isinstance(value, Tensor) else value)


def primary_tensor(output: Any) -> Tensor | None:
    """The tensor a model's output is scored by: the output itself, a Hugging Face
    ``ModelOutput``'s (or a dict's) ``logits``, else the first tensor of a tuple, list or
    dict (``last_hidden_state`` for an encoder); None where there is none."""
    if isinstance(output, Tensor):
        return output
    logits = getattr(output, "logits", None)
    if logits is None and isinstance(output, Mapping):
        logits = output.get("logits")
    if isinstance(logits, Tensor):
        return logits
    values = output.values() if isinstance(output, Mapping) else output
    if isinstance(values, tuple | list) or isinstance(output, Mapping):
        return next((v for v in values if isinstance(v, Tensor)), None)
    return None


def _output_error(out: Any, ref: Any) -> float:
    out, ref = primary_tensor(out), primary_tensor(ref)
    if isinstance(out, Tensor) and isinstance(ref, Tensor) and out.shape == ref.shape:
        den = float(torch.linalg.vector_norm(ref.double()))
        num = float(torch.linalg.vector_norm(out.double() - ref.double()))
        return num / den if den > 0 else num
    return math.nan


def audit(
    model: nn.Module,
    batch: Any,
    ranks: Sequence[int],
    methods: Sequence[str] = ("rpka",),
    metric: Metric | None = None,
    *,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    fallback: str = "exact",
    repeats: int = 3,
    seed: int = 0,
    law_eps: float | None = rank_law.DEFAULT_EPS,
    law_fit: Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """The audit of ``model`` on ``batch`` (module docstring): one row per (method, rank,
    call site). ``law_eps``: the output error the rank law's ``predicted_rank`` is for (in
    (0, 1); None: no law columns); ``law_fit``: the law's fit per method (default the
    committed one, ``rpka.rank_law.load_fit``; missing: a warning, NaN columns).
    ``metric(output) -> float`` scores the model's output (loss, accuracy; None: no metric
    columns' values). ``options``: per method name, its options (e.g.
    ``{"rpka": {"causal_block": 16}}``). ``fallback``: what a call the method cannot serve
    does (``"exact"``: runs exactly, counted in ``swapped``; ``"error"``: raises). A
    ``torch.Generator`` among the options is reset to its state at the call before each
    pass. The model's mode is left as it is. Raises :class:`SwapRefused` when the model made no
    SDPA call, or when no method served any call. A (method, rank) that served no call gets
    no row (it would show exact attention's numbers under the method's name) and a warning;
    ``table.attrs["not_served"]`` lists them with their reasons. A model's output is scored
    by :func:`primary_tensor` (a Hugging Face ``ModelOutput``'s logits, a tuple's first
    tensor)."""
    if not ranks or any(not isinstance(r, int) or isinstance(r, bool) or r < 1 for r in ranks):
        raise ValueError(f"ranks must be positive integers, got {list(ranks)}")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    options = options or {}
    grid = [(m, r) for m in methods for r in ranks]
    for m, r in grid:  # bad method names and options fail before any run
        SDPASwap(m, r, **options.get(m, {}))
    fits, law_source = law_of(law_eps, law_fit)

    # a generator passed as an option starts every pass from its state now, as the global
    # RNG starts from ``seed``: each (method, rank) draws as a fresh model would
    generators = [(g, g.get_state()) for opts in options.values() for g in opts.values()
                  if isinstance(g, torch.Generator)]  # fmt: skip

    def variant(method: str, rank: int) -> Callable[[], SDPASwap]:
        def make() -> SDPASwap:
            for g, state in generators:
                g.set_state(state)
            swapper = SDPASwap(
                method, rank, fallback=fallback, record=True, **options.get(method, {})
            )
            swapper.warn_at_exit = False  # the table's `swapped` column says it
            return swapper

        return make

    law = None if fits is None else Law(fits, law_eps, methods, lambda *mr: variant(*mr)(), seed)
    with SiteTracker(model) as tracker:
        exact = Pass(SDPASwap("exact", record=True), tracker, exact=True, law=law)
        out_exact = exact.run(model, batch, seed)
        if not exact.swapper.records:
            raise SwapRefused(NO_CALL)
        passes = []
        for m, r in grid:
            run = Pass(variant(m, r)(), tracker, exact=False)
            passes.append((run, run.run(model, batch, seed)))
        if not any(run.swapper.swapped for run, _ in passes):
            reasons = sorted({r for run, _ in passes for r in run.swapper.reasons})
            raise SwapRefused(f"no SDPA call could be served by {list(methods)}: {reasons}")
        not_served = _not_served(grid, passes)
        variants = [variant("exact", 1), *(variant(m, r) for m, r in grid)]
        times = interleaved_times(model, batch, variants, tracker, repeats, seed)
    table = _table(exact, out_exact, passes, grid, times, metric, repeats, seed)
    table.attrs["not_served"] = not_served
    table.attrs["law"] = {"eps": law_eps, "source": law_source}
    return table


def _not_served(
    grid: list[tuple[str, int]], passes: list[tuple[Pass, Any]]
) -> list[dict[str, Any]]:
    """The (method, rank)s that served no call, with why, each warned about: they get no
    row in the table, which would show exact attention's numbers under their name."""
    rows = [
        {"method": m, "rank": r, "reasons": dict(run.swapper.reasons)}
        for (m, r), (run, _) in zip(grid, passes, strict=True)
        if not run.swapper.swapped
    ]
    for row in rows:
        warnings.warn(
            f"rpka.swap.audit: {row['method']} at rank {row['rank']} served no SDPA call "
            f"(every call ran exact attention: {row['reasons']}); left out of the table",
            stacklevel=3,
        )
    return rows


def _table(
    exact: Pass,
    out_exact: Any,
    passes: list[tuple[Pass, Any]],
    grid: list[tuple[str, int]],
    times: list[tuple[float, dict[str, float]]],
    metric: Metric | None,
    repeats: int,
    seed: int,
) -> pd.DataFrame:
    """One row per (method, rank, site) (:func:`audit`'s columns)."""
    exact_sites = per_site(exact.swapper.records or [])
    metric_exact = _scalar(metric, out_exact)
    exact_s, exact_site_s = times[0]
    rows = []
    for (m, r), (run, out), (forward_s, site_s) in zip(grid, passes, times[1:], strict=True):
        if not run.swapper.swapped:
            continue  # served nothing: a row would show exact attention as a free lunch
        value = _scalar(metric, out)
        for site, stats in per_site(run.swapper.records or []).items():
            errors = run.errors.get(site, [])
            rows.append(
                {
                    "method": m,
                    "rank": r,
                    "site": site,
                    "calls": int(stats["calls"]),
                    "swapped": stats["swapped"],
                    "output_error": float(np.mean(errors)) if errors else math.nan,
                    "logit_std": float(np.mean(exact.spreads.get(site, [math.nan]))),
                    **law_columns(exact.law, site, m),
                    "metric": value,
                    "metric_exact": metric_exact,
                    "metric_change": value - metric_exact,
                    "model_output_error": _output_error(out, out_exact),
                    "forward_cpu_s": forward_s,
                    "exact_forward_cpu_s": exact_s,
                    "forward_ratio": forward_s / exact_s if exact_s > 0 else math.nan,
                    "site_cpu_s": site_s.get(site, math.nan),
                    "exact_site_cpu_s": exact_site_s.get(site, math.nan),
                    "site_ratio": site_s.get(site, math.nan) / exact_site_s[site]
                    if exact_site_s.get(site)
                    else math.nan,
                }
            )
    table = pd.DataFrame(rows)
    table.attrs.update(
        metric_exact=metric_exact, sites=list(exact_sites), repeats=repeats, seed=seed
    )
    return table


def plot_errors(table: pd.DataFrame, floor: float = 1e-16) -> Figure:
    """Output error against rank, one line per (call site, method); errors below ``floor``
    (full rank: exact to round-off) are drawn at it, on log-log axes."""
    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    ax = fig.add_subplot()
    styles = ["-", "--", ":", "-."]
    sites = list(dict.fromkeys(table["site"]))
    colours = {site: f"C{i % 10}" for i, site in enumerate(sites)}
    for j, (method, by_method) in enumerate(table.groupby("method", sort=False)):
        for site, rows in by_method.groupby("site", sort=False):
            rows = rows.sort_values("rank")
            ax.plot(
                rows["rank"],
                np.maximum(rows["output_error"], floor),
                styles[j % 4],
                marker="o",
                color=colours[site],
                label=f"{site} ({method})",
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("rank (landmarks)")
    ax.set_ylabel(r"attention output error $|O - \hat O|_F / |O|_F$")
    ax.legend(fontsize="small")
    return fig
