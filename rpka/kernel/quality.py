"""The approximation-quality study and the mechanism study around the trace identity.

docs/design.md section 3. ``rpka.kernel.mechanism`` checks the trace identity of one RPCholesky
step; this module measures how well low-rank pivoting approximates the kernel and the
attention output on trained Q/K: residual trace against rank for each pivot rule and the
optimum (:func:`approximation_quality`), every attention method's output error against
exact (:func:`method_output_errors`), and :func:`mechanism_study`, both studies on one
model's attention inputs.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Sequence
from dataclasses import asdict

import numpy as np
import pandas as pd
import torch
from torch import Tensor
from tqdm import tqdm  # plain text bars: no ipywidgets needed in notebooks

from rpka.attention import build, options_of
from rpka.attention.rpcholesky import (
    rpcholesky,
)
from rpka.config.bench import MechanismConfig
from rpka.kernel.matrix import kernel_eigenvalues, pivot_points, pivoted_matrix, tail_sums
from rpka.kernel.mechanism import (
    QKV,
    check_layers,
    resolve_monte_carlo,
    select_indices,
    trace_identity_study,
)

# --------------------------------------------------------------------------- 2. quality


def _spread(values: np.ndarray, prefix: str) -> dict[str, float]:
    """mean, sd (ddof=1), min, 10/50/90 % quantiles and max of the last axis."""
    qs = np.quantile(values, [0.1, 0.5, 0.9], axis=-1)
    return {
        f"{prefix}_mean": float(values.mean()),
        f"{prefix}_sd": float(values.std(ddof=1)) if values.size > 1 else 0.0,
        f"{prefix}_min": float(values.min()),
        f"{prefix}_q10": float(qs[0]),
        f"{prefix}_median": float(qs[1]),
        f"{prefix}_q90": float(qs[2]),
        f"{prefix}_max": float(values.max()),
    }


@torch.no_grad()
def layer_quality(q: Tensor, k: Tensor, v: Tensor, config: MechanismConfig, layer: int = 0) -> dict:
    """Approximation quality of one layer: q, k (I, H, n, d), v (I, H, m, d_v).

    Returns JSON-able ``rows`` (one per item, head, rule, rank: residual-trace spread over
    seeds as fractions of ``tr A``, optimum, ratio, output error), ``guards`` (one per rule
    and rank, summed over items, heads and seeds) and ``spectra`` (eigenvalues / tr A).
    Residual traces come from one run of ``max(ranks)`` pivots per seed (nested prefixes);
    output errors from RPKA's own independent draws at each rank, in float64 so that they
    measure the approximation, not round-off.
    """
    seeds = config.quality_seeds
    points = pivot_points(q, k, config.pivot_set)  # (I, H, N, d)
    ranks = sorted({min(r, points.shape[-2]) for r in config.quality_ranks})
    matrix = pivoted_matrix(points, config.weighting, config.tempering)
    trace0 = matrix.diagonal(dim1=-2, dim2=-1).sum(-1)  # (I, H)
    eig = kernel_eigenvalues(matrix)  # (I, H, N)
    optimum = tail_sums(eig, ranks)  # (I, H, R)
    qkv64 = tuple(x.to(torch.float64) for x in (q, k, v))
    exact = build("exact")(*qkv64)  # (I, H, n, d_v), torch SDPA
    rows, guards = [], []
    for rule_index, rule in enumerate(config.rules):
        generator = torch.Generator(device=points.device).manual_seed(
            config.seed + 1000 * layer + rule_index
        )
        run = rpcholesky(
            points.unsqueeze(0).expand(seeds, *points.shape),
            max(ranks),
            rule,
            generator,
            weighting=config.weighting,
            tempering=config.tempering,
        )
        residual = run.trace[..., ranks].permute(1, 2, 3, 0).cpu().numpy()  # (I, H, R, seeds)
        errors = {}
        for rank in ranks:  # after the run: the same generator draws RPKA's pivots, in order
            errors[rank], counts = _output_error(qkv64, exact, rule, rank, generator, config)
            guards.append(_guard_row(layer, rule, rank, counts))
        rows += _quality_rows(
            layer, rule, points.shape[-2], ranks, residual, optimum, trace0, errors, config
        )
    return {"rows": rows, "guards": guards, "spectra": _spectra(layer, eig / trace0.unsqueeze(-1))}


def _seed_copies(x: Tensor, seeds: int) -> Tensor:
    """(I, H, ...) -> (seeds * I, H, ...), seed-major: one copy per pivot seed."""
    return x.unsqueeze(0).expand(seeds, *x.shape).reshape(seeds * x.shape[0], *x.shape[1:])


def _output_error(
    qkv64: tuple[Tensor, Tensor, Tensor],
    exact: Tensor,
    rule: str,
    rank: int,
    generator: torch.Generator,
    config: MechanismConfig,
) -> tuple[np.ndarray, dict[str, int]]:
    """RPKA's relative output error against ``exact`` (I, H, n, d_v) per item, head and
    seed, ``|out - exact|_F / |exact|_F`` (I, H, seeds), and its guard counts."""
    seeds = config.quality_seeds
    attn = build(
        "rpka",
        rank=rank,
        pivot_rule=rule,
        pivot_set=config.pivot_set,
        weighting=config.weighting,
        tempering=config.tempering,
        den_floor=config.den_floor,
        generator=generator,
    )
    out = attn(*(_seed_copies(x, seeds) for x in qkv64)).reshape(seeds, *exact.shape)
    norm = exact.pow(2).sum((-2, -1)).sqrt()
    err = (out - exact).pow(2).sum((-2, -1)).sqrt() / norm  # (seeds, I, H)
    return err.permute(1, 2, 0).cpu().numpy(), attn.guard_counts


def _guard_row(layer: int, rule: str, rank: int, counts: dict[str, int]) -> dict:
    """How often RPKA's guards fired at one rule and rank, with their fractions."""
    return {
        "layer": layer,
        "rule": rule,
        "rank": rank,
        **counts,
        "denominator_fraction": counts["denominator"] / max(counts["rows"], 1),
        "clamped_fraction": counts["clamped"] / max(counts["entries"], 1),
    }


def _quality_rows(
    layer: int,
    rule: str,
    n_points: int,
    ranks: list[int],
    residual: np.ndarray,
    optimum: Tensor,
    trace0: Tensor,
    errors: dict[int, np.ndarray],
    config: MechanismConfig,
) -> list[dict]:
    """One row per item, head and rank of one pivot rule: the residual trace over seeds
    (``residual`` (I, H, R, seeds)) as fractions of ``tr A`` (``trace0`` (I, H)), the
    optimum (``optimum`` (I, H, R)), their ratio and the output error; ``n_points``: N."""
    n_items, n_heads = residual.shape[:2]
    rows = []
    for item in range(n_items):
        for head in range(n_heads):
            tr = float(trace0[item, head])
            for j, rank in enumerate(ranks):
                res = residual[item, head, j]
                opt = float(optimum[item, head, j])
                ratio_ok = opt > config.optimum_floor * tr
                ratio = res / opt if ratio_ok else np.full_like(res, np.nan)
                rows.append(
                    {
                        "layer": layer,
                        "head": head,
                        "item": item,
                        "n_points": n_points,
                        "rule": rule,
                        "rank": rank,
                        "seeds": config.quality_seeds,
                        "trace0": tr,
                        **_spread(res / tr, "rel_residual"),
                        "rel_optimum": opt / tr,
                        "ratio_mean": float(ratio.mean()) if ratio_ok else None,
                        "ratio_min": float(ratio.min()) if ratio_ok else None,
                        "ratio_max": float(ratio.max()) if ratio_ok else None,
                        **_spread(errors[rank][item, head], "output_error"),
                    }
                )
    return rows


def _spectra(layer: int, spectrum: Tensor) -> list[dict]:
    """Each item's and head's eigenvalues as fractions of ``tr A`` (``spectrum`` (I, H, N)),
    with their summary."""
    n_items, n_heads = spectrum.shape[:2]
    return [
        {
            "layer": layer,
            "head": head,
            "item": item,
            **spectrum_summary(spectrum[item, head]),
            "eigenvalues": spectrum[item, head].tolist(),
        }
        for item in range(n_items)
        for head in range(n_heads)
    ]


def summarise(
    rows: pd.DataFrame | Sequence[dict], by: Sequence[str] = ("rule", "rank")
) -> pd.DataFrame:
    """Aggregate per-head quality rows over heads (and items): one row per ``by`` group.

    Means of the per-head seed means, the envelope (min of minima, max of maxima), the
    median and maximum ratio to the optimum across heads.
    """
    frame = pd.DataFrame(rows)
    grouped = frame.groupby(list(by), sort=True)
    summary = grouped.agg(
        n_heads=("head", "size"),
        rel_residual_mean=("rel_residual_mean", "mean"),
        rel_residual_sd_mean=("rel_residual_sd", "mean"),
        rel_residual_min=("rel_residual_min", "min"),
        rel_residual_max=("rel_residual_max", "max"),
        rel_optimum_mean=("rel_optimum", "mean"),
        ratio_median=("ratio_mean", "median"),
        ratio_max=("ratio_max", "max"),
        ratio_min=("ratio_min", "min"),
        output_error_mean=("output_error_mean", "mean"),
        output_error_min=("output_error_min", "min"),
        output_error_max=("output_error_max", "max"),
    )
    return summary.reset_index()


def approximation_quality(
    qkv_per_layer: Sequence[QKV], config: MechanismConfig | None = None, progress: bool = True
) -> dict[str, object]:
    """Approximation quality of every studied layer and head (part 2), JSON-able.

    Returns ``rows`` (per layer, head, item, rule, rank), ``summary`` (over heads, per rule
    and rank), ``by_layer`` (per layer, rule and rank), ``guards`` and ``spectra``.
    """
    config = config or MechanismConfig()
    config.validate()
    check_layers(qkv_per_layer)
    layers = select_indices(len(qkv_per_layer), config.layers, "layers")
    heads = select_indices(qkv_per_layer[0][0].shape[1], config.heads, "heads")
    start = time.perf_counter()
    rows, guards, spectra = [], [], []
    for layer in tqdm(layers, desc="approximation quality", disable=not progress):
        q, k, v = (x[: config.quality_items, heads] for x in qkv_per_layer[layer])
        part = layer_quality(q, k, v, config, layer)
        for row in part["rows"] + part["spectra"]:
            row["head"] = heads[row["head"]]
        rows += part["rows"]
        guards += part["guards"]
        spectra += part["spectra"]
    guard_frame = pd.DataFrame(guards).groupby(["rule", "rank"], sort=True)
    guard_totals = guard_frame[["denominator", "rows", "clamped", "entries"]].sum().reset_index()
    summary = summarise(rows).merge(guard_totals, on=["rule", "rank"])
    summary["denominator_fraction"] = summary["denominator"] / summary["rows"]
    summary["clamped_fraction"] = summary["clamped"] / summary["entries"]
    return {
        "seconds": time.perf_counter() - start,
        "rows": rows,
        "summary": _records(summary),
        "by_layer": _records(summarise(rows, ("layer", "rule", "rank"))),
        "guards": guards,
        "spectra": spectra,
    }


def spectrum_summary(fractions: Tensor, mass: float = 0.9) -> dict[str, float]:
    """Two numbers for a spectrum ``lambda_i / tr A`` (descending, summing to 1).

    ``effective_rank``: ``1 / sum_i p_i^2`` (the participation ratio, ``(tr A)^2 / |A|_F^2``);
    ``rank_90``: the fewest eigenvalues holding ``mass`` (90 %) of the trace - the rank an
    optimal approximation needs for a 10 % residual trace.
    """
    p = fractions.to(torch.float64)
    held = torch.cumsum(p, -1)
    return {
        "effective_rank": float(1.0 / p.pow(2).sum()),
        f"rank_{round(100 * mass)}": int((held < mass - 1e-12).sum()) + 1,
    }


def compare_models(results: dict[str, dict], rule: str = "rpc") -> pd.DataFrame:
    """What training does, one row per model and rank (e.g. ``{"trained": .., "init": ..}``).

    Columns: mean effective rank and ``rank_90`` over heads, and at each rank the optimal
    and the ``rule``'s residual trace (fractions of tr A), the median ratio to the optimum
    and the mean output error.
    """
    frames = []
    for label, result in results.items():
        quality = result["quality"] if "quality" in result else result
        spectra = pd.DataFrame(quality["spectra"])
        summary = pd.DataFrame(quality["summary"])
        part = summary[summary["rule"] == rule][
            ["rank", "rel_optimum_mean", "rel_residual_mean", "ratio_median", "output_error_mean"]
        ].copy()
        part.insert(0, "model", label)
        part.insert(1, "effective_rank_mean", spectra["effective_rank"].mean())
        part.insert(2, "rank_90_mean", spectra["rank_90"].mean())
        frames.append(part)
    return pd.concat(frames, ignore_index=True)


def quality_frames(quality: dict[str, object]) -> dict[str, pd.DataFrame]:
    """The quality result's tables as DataFrames: rows, summary, by_layer, guards."""
    return {key: pd.DataFrame(quality[key]) for key in ("rows", "summary", "by_layer", "guards")}


def _records(frame: pd.DataFrame) -> list[dict]:
    """DataFrame -> JSON-able records (numpy scalars to Python, NaN to None)."""
    clean = frame.astype(object).where(frame.notna(), None)
    return [
        {k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()}
        for r in clean.to_dict("records")
    ]


# --------------------------------------------------------------------------- every method


@torch.no_grad()
def method_output_errors(
    qkv_per_layer: Sequence[QKV],
    method: str,
    options: dict[str, object] | None = None,
    ranks: Sequence[int] = (16, 64, 128),
    seeds: int = 5,
    seed: int = 0,
) -> list[dict[str, object]]:
    """Relative output error of any registered method against exact SDPA, per rank.

    For each rank r the method is built from ``options`` with ``rank=r`` (for RPKA-like
    methods: landmarks; Nystromformer: segments; Performer: random features), ``seeds``
    times with a fresh seeded generator where it takes one (new pivots / features each time;
    a deterministic method gives the same error every time), and applied to every layer's
    inputs in float64, so that the error measures the approximation, not round-off. The
    error of one (seed, item, head) is ``|O_hat - O|_F / |O|_F`` over its (n, d_v) output.

    Args:
        qkv_per_layer: one ``(q, k, v)`` per layer, each (B, H, n, d), as fed to the
            attention (e.g. ``TransformerTiny.attention_inputs`` of a trained model).
        method, options: the method as a bench arm has it (``rank`` is replaced).
        ranks: ranks compared (a method caps a rank above its number of points itself).

    Returns JSON-able rows, one per rank: ``rank``, ``n`` (layers x items x heads x seeds)
    and the spread of the error (``error_mean``, ``_sd``, ``_min``, ``_q10``, ``_median``,
    ``_q90``, ``_max``).
    """
    check_layers(qkv_per_layer)
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
        raise ValueError(f"seeds must be an integer >= 1, got {seeds!r}")
    if not ranks or any(not isinstance(r, int) or isinstance(r, bool) or r < 1 for r in ranks):
        raise ValueError(f"ranks must be positive integers, got {list(ranks)}")
    takes = options_of(method)  # raises ValueError for an unknown method
    base = {k: v for k, v in (options or {}).items() if k not in ("rank", "generator")}
    inputs = [tuple(x.to(torch.float64) for x in qkv) for qkv in qkv_per_layer]
    exact = [build("exact")(*qkv) for qkv in inputs]
    rows = []
    for rank in ranks:
        errors = []
        for s in range(seeds):
            extra = {"rank": rank} if "rank" in takes else {}
            if "generator" in takes:
                extra["generator"] = torch.Generator().manual_seed(seed + 1000 * rank + s)
            attn = build(method, **base, **extra)  # fresh: new draws, empty caches
            for (q, k, v), ref in zip(inputs, exact, strict=True):
                out = attn(q, k, v)
                err = (out - ref).pow(2).sum((-2, -1)).sqrt() / ref.pow(2).sum((-2, -1)).sqrt()
                errors.append(err.flatten())
        values = torch.cat(errors).cpu().numpy()
        rows.append({"rank": int(rank), "n": int(values.size), **_spread(values, "error")})
    return rows


# --------------------------------------------------------------------------- the study


def mechanism_study(
    qkv_per_layer: Sequence[QKV],
    config: MechanismConfig | None = None,
    progress: bool = True,
    **options: object,
) -> dict[str, object]:
    """Trace identity and approximation quality for one model's attention inputs.

    Args:
        qkv_per_layer: one ``(q, k, v)`` per layer, each (B, H, n, d) exactly as fed to the
            attention (unscaled; RPKA and SDPA scale internally).
        config: a :class:`MechanismConfig`; ``options`` override its fields.

    Returns a JSON-able dict: ``config``, ``mechanism_signature`` (bench_report.json's keys,
    ``trained_model`` for the caller to fill), ``trace_identity`` (per-head per-step arrays),
    ``quality`` (see :func:`approximation_quality`), ``timings_s`` and the environment.
    Call it once for a trained and once for a freshly initialised model.
    """
    config = config or MechanismConfig()
    if options:
        unknown = sorted(set(options) - set(asdict(config)))
        if unknown:
            raise ValueError(f"unknown option(s) {unknown}; valid: {sorted(asdict(config))}")
        config = MechanismConfig(**{**asdict(config), **options})
    config.validate()
    check_layers(qkv_per_layer)
    config = resolve_monte_carlo(config, qkv_per_layer[0][0].device)
    identity = trace_identity_study(qkv_per_layer, config, progress)
    quality = approximation_quality(qkv_per_layer, config, progress)
    q = qkv_per_layer[0][0]
    return {
        "config": config.to_dict(),
        "mechanism_signature": identity["signature"],
        "trace_identity": identity["heads"],
        "quality": quality,
        "timings_s": {"trace_identity": identity["seconds"], "quality": quality["seconds"]},
        "shape": {"layers": len(qkv_per_layer), "batch_heads_n_d": list(q.shape)},
        "device": str(q.device),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
