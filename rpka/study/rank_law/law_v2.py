"""The rank law v2's fit and held-out reading (issue 54; docs/rank_law.md, "Law v2").

From ``heads.json`` (``rpka.study.rank_law.heads``), per method: log2 r_eps ~ Normal(x b,
sigma^2) with x = 1, rho, log2 d, log2 n, log2(1/eps), log2 p (``rpka.kernel.law``'s
``law_features``), fitted by interval-censored maximum likelihood on the ladder's brackets
(:func:`fit_censored`) over the fit set; intervals by a bootstrap clustered by model. The
held-out tracks are then read by the registered rule (:func:`held_out_reading`) against two
naive predictors; beside it the paired pivoting comparison (:func:`pivoting_paired`) and
the planted law (the slope in rho, whether n drops out). Written into ``rank_law.json``
under ``law_v2``.

    python -m rpka rank-law fit-v2
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy import optimize, special, stats

from rpka.io import read_json, write_result_json
from rpka.kernel.law import EPSILONS, RHO_STATISTICS, law_features
from rpka.paths import COMMITTED_RESULTS, FRONTIER_FILE, resolve
from rpka.study.rank_law.heads import HEADS_FILE, METHODS, PLANTED_HEADS_FILE
from rpka.study.rank_law.law import INDEX_FILE

TERMS = ("rho", "log2_d", "log2_n", "log2_inv_eps", "log2_p")  # registered order
BOOTSTRAP = 200  # resamples of the fit set's models (registered)
CONFIDENCE = 0.95
HELD_FACTOR_LOG2 = 1.0  # held: median |log2 predicted / observed| at most one ladder rung
THEORY_SLOPE = 1 / math.log(2)  # log2 r grows by 1 / ln 2 per unit of rho (e^rho)
SEED = 0
TRAINED_FRONTIER = f"{COMMITTED_RESULTS}/{FRONTIER_FILE}"  # the trained r* per track (item 4)
ROLES = ("fit", "held_out", "extra")  # extra: the documented deviation's fit-only models
FIGURE_EPS = 0.03  # the report's figure: r_eps against rho at this eps (the default)


def observed(row: dict[str, Any]) -> float:
    """The rung at which eps was reached; right-censored: the full rank."""
    return float(row["full_rank"] if row["censored"] else row["r_upper"])


def bracket(rows: Sequence[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """log2 of the ladder's brackets (lower, upper]: -inf below the first rung, +inf
    when right-censored."""
    lo = np.array([math.log2(r["r_lower"]) if r["r_lower"] > 0 else -np.inf for r in rows])
    hi = np.array([np.inf if r["censored"] else math.log2(r["r_upper"]) for r in rows])
    return lo, hi


def used_terms(rows: Sequence[dict[str, Any]], statistic: str) -> list[str]:
    """The registered terms that vary over ``rows``."""
    full = design(rows, TERMS, statistic)
    return [t for i, t in enumerate(TERMS) if np.ptp(full[:, i + 1]) > 1e-12]


def design(rows: Sequence[dict[str, Any]], terms: Sequence[str], statistic: str) -> np.ndarray:
    """The regressors of ``rows`` (N, 1 + len(terms))."""
    return np.stack([
        law_features(r, r["d_head"], r["n"], r["eps"], r["p"], terms, statistic) for r in rows
    ])  # fmt: skip


def log_likelihood(beta: np.ndarray, x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> float:
    """Interval-censored normal log likelihood: sum log(Phi(z_hi) - Phi(z_lo)); the last
    entry of ``beta`` is log sigma."""
    mu, sigma = x @ beta[:-1], math.exp(beta[-1])
    a, b = (lo - mu) / sigma, (hi - mu) / sigma
    log_b, log_a = special.log_ndtr(b), special.log_ndtr(a)
    # log(Phi(b) - Phi(a)) = log Phi(b) + log(1 - Phi(a) / Phi(b)); upper tail where a > 0
    # keeps precision: Phi(b) - Phi(a) = Phi(-a) - Phi(-b)
    log_na, log_nb = special.log_ndtr(-a), special.log_ndtr(-b)
    with np.errstate(divide="ignore", invalid="ignore"):
        upper = log_na + np.log1p(-np.exp(log_nb - log_na))
        lower = log_b + np.log1p(-np.exp(log_a - log_b))
    return float(np.where(a > 0, upper, lower).sum())


def fit_censored(
    x: np.ndarray, lo: np.ndarray, hi: np.ndarray, start: np.ndarray | None = None
) -> tuple[np.ndarray, float]:
    """Maximum likelihood (b, sigma) of the interval-censored normal regression, from OLS
    on the brackets' midpoints (one rung beyond an open end) unless ``start``."""
    if start is None:
        mid = np.where(np.isinf(lo), hi - 1, np.where(np.isinf(hi), lo + 1, (lo + hi) / 2))
        coef, *_ = np.linalg.lstsq(x, mid, rcond=None)
        start = np.append(coef, math.log(max(np.std(mid - x @ coef), 0.25)))
    result = optimize.minimize(
        lambda beta: -log_likelihood(beta, x, lo, hi), start, method="L-BFGS-B"
    )
    return result.x[:-1], float(math.exp(result.x[-1]))


def fit_method(
    rows: Sequence[dict[str, Any]],
    statistic: str = "rho_bound",
    bootstrap: int = BOOTSTRAP,
    seed: int = SEED,
) -> dict[str, Any]:
    """The law of one method on ``rows`` (its fit set): coefficients, sigma, the bootstrap
    interval per coefficient clustered by model (the row's ``model``)."""
    terms = used_terms(rows, statistic)
    x, (lo, hi) = design(rows, terms, statistic), bracket(rows)
    coef, sigma = fit_censored(x, lo, hi)
    models = sorted({r["model"] for r in rows})
    index = {m: [i for i, r in enumerate(rows) if r["model"] == m] for m in models}
    rng = np.random.default_rng(seed)
    draws = []
    start = np.append(coef, math.log(sigma))
    for _ in range(bootstrap):
        pick = np.concatenate([index[m] for m in rng.choice(models, len(models))])
        draws.append(fit_censored(x[pick], lo[pick], hi[pick], start)[0])
    tail = 100 * (1 - CONFIDENCE) / 2
    names = ["intercept", *terms]
    ci = None
    if draws:
        low, high = np.percentile(np.array(draws), [tail, 100 - tail], axis=0)
        ci = {n: [float(a), float(b)] for n, a, b in zip(names, low, high, strict=True)}
    return {
        "statistic": statistic, "terms": terms, "coef": coef.tolist(), "sigma": sigma,
        "ci": ci,
        "rows": len(rows), "models": len(models), "censored_rows": int(np.isinf(hi).sum()),
        "bootstrap": bootstrap,
    }  # fmt: skip


def predicted(fit: dict[str, Any], rows: Sequence[dict[str, Any]]) -> np.ndarray:
    """The law's median r_eps per row, capped at the method's full rank (at least 1)."""
    x = design(rows, fit["terms"], fit["statistic"])
    rank = np.exp2(np.minimum(x @ np.asarray(fit["coef"]), 62))
    return np.clip(rank, 1, [r["full_rank"] for r in rows])


def naive_predictors(fit_rows: Sequence[dict[str, Any]]) -> dict[float, dict[str, float]]:
    """Per eps: the constant (median observed r_eps) and c of r = c n (median observed / n)."""
    out = {}
    for eps in EPSILONS:
        own = [r for r in fit_rows if r["eps"] == eps]
        out[eps] = {"constant": float(np.median([observed(r) for r in own])),
                    "per_token": float(np.median([observed(r) / r["n"] for r in own]))}  # fmt: skip
    return out


def log2_errors(
    fit: dict[str, Any], naive: dict[float, dict[str, float]], rows: Sequence[dict[str, Any]]
) -> dict[str, np.ndarray]:
    """|log2 predicted / observed| per row: the law and the two naive predictors."""
    obs = np.array([observed(r) for r in rows])
    constant = np.array([naive[r["eps"]]["constant"] for r in rows])
    per_n = np.array([naive[r["eps"]]["per_token"] * r["n"] for r in rows])
    return {name: np.abs(np.log2(pred / obs))
            for name, pred in (("law", predicted(fit, rows)), ("constant", constant),
                               ("proportional_to_n", per_n))}  # fmt: skip


def held_out_reading(
    fit: dict[str, Any], fit_rows: Sequence[dict[str, Any]], held: Sequence[dict[str, Any]],
    bootstrap: int = BOOTSTRAP, seed: int = SEED,
) -> dict[str, Any]:  # fmt: skip
    """The registered rule on the held-out rows: the median |log2 predicted / observed| of
    the law at most :data:`HELD_FACTOR_LOG2` and below both naive predictors'; with the
    law's median error's bootstrap interval over held-out models, and per track."""
    if not held:
        return {"held": None, "why": "no held-out rows measured"}
    naive = naive_predictors(fit_rows)
    errors = log2_errors(fit, naive, held)
    medians = {name: float(np.median(e)) for name, e in errors.items()}
    models = sorted({r["model"] for r in held})
    index = {m: [i for i, r in enumerate(held) if r["model"] == m] for m in models}
    rng = np.random.default_rng(seed)
    boot = [float(np.median(errors["law"][np.concatenate([index[m] for m in
            rng.choice(models, len(models))])])) for _ in range(bootstrap)]  # fmt: skip
    tail = 100 * (1 - CONFIDENCE) / 2
    tracks = sorted({r["track"] for r in held})
    per_track = {t: {name: float(np.median(e[[r["track"] == t for r in held]]))
                     for name, e in errors.items()} for t in tracks}  # fmt: skip
    held_ok = medians["law"] <= HELD_FACTOR_LOG2 and medians["law"] < min(
        medians["constant"], medians["proportional_to_n"]
    )
    return {
        "held": bool(held_ok), "median_abs_log2_error": medians,
        "law_median_ci": [float(np.percentile(boot, tail)), float(np.percentile(boot, 100 - tail))],
        "per_track": per_track, "rows": len(held), "models": len(models),
        "naive": {str(k): v for k, v in naive.items()},
        "rule": "median |log2 predicted / observed| <= 1 and below both naive predictors'",
    }  # fmt: skip


def pivoting_paired(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """RPKA against uniform landmarks on the same head and inputs: per rank, Wilcoxon
    signed-rank of log(error_rpka / error_uniform) over heads (two-sided) and the heads where
    RPKA is lower; per tercile of rho_bound, the same on each head's mean log ratio over the
    ranks <= 16 and the ranks >= 32 below full rank."""
    first = [r for r in rows if r["eps"] == EPSILONS[0]]
    key = lambda r: (r["model"], r["layer"], r["head"])  # noqa: E731
    rpka = {key(r): r for r in first if r["method"] == "rpka"}
    uniform = {key(r): r for r in first if r["method"] == "nystrom-uniform"}
    pairs = []  # (head key, rank, log ratio, rho)
    for k, a in rpka.items():
        b = uniform.get(k)
        if b is None:
            continue
        for rank, ea, eb in zip(a["ranks"], a["errors"], b["errors"], strict=False):
            if rank < a["full_rank"] and ea > 0 and eb > 0 and math.isfinite(ea + eb):
                pairs.append((k, rank, math.log(ea / eb), a["rho_bound"]))
    per_rank = []
    for rank in sorted({p[1] for p in pairs}):
        d = np.array([p[2] for p in pairs if p[1] == rank])
        per_rank.append({"rank": rank, **_signed(d)})
    rho = np.array([r["rho_bound"] for r in rpka.values()])
    cuts = np.quantile(rho, [1 / 3, 2 / 3]) if len(rho) else [0, 0]
    terciles = []
    for t, (low, high) in enumerate(zip([-np.inf, *cuts], [*cuts, np.inf], strict=True)):
        for band, inside in (("rank<=16", lambda r: r <= 16), ("rank>=32", lambda r: r >= 32)):
            heads: dict[Any, list[float]] = {}
            for k, rank, d, rho_k in pairs:
                if low <= rho_k < high and inside(rank):
                    heads.setdefault(k, []).append(d)
            d = np.array([np.mean(v) for v in heads.values()])
            terciles.append({"tercile": t, "rho_bound": [float(low), float(high)], "band": band,
                             **_signed(d)})  # fmt: skip
    return {"per_rank": per_rank, "by_rho": terciles,
            "what": "log(error_rpka / error_uniform) per head; < 0: RPKA lower"}  # fmt: skip


def _signed(d: np.ndarray) -> dict[str, Any]:
    """Heads, RPKA lower count, median log ratio, Wilcoxon p (None under 6 pairs)."""
    if len(d) == 0:
        return {"heads": 0, "rpka_lower": 0, "median_log_ratio": None, "wilcoxon_p": None}
    p = float(stats.wilcoxon(d).pvalue) if len(d) >= 6 and np.any(d != 0) else None
    return {"heads": int(len(d)), "rpka_lower": int((d < 0).sum()),
            "median_log_ratio": float(np.median(d)), "wilcoxon_p": p}  # fmt: skip


def law_v2(
    heads: dict[str, Any],
    planted: dict[str, Any] | None,
    bootstrap: int = BOOTSTRAP,
    log: Callable[[str], None] | None = print,
    frontier: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The fit per method (primary and secondary statistics), the held-out reading, the
    paired pivoting comparison, the planted law, the enlarged fit (the deviation's models,
    where measured) and the link to the trained r* (``frontier``: a ``frontier.json``)."""
    rows = heads["rows"]
    registered = [r for r in rows if r["role"] != "extra"]
    out: dict[str, Any] = {"fit": {}, "secondary": {}, "held_out": {}, "planted": {},
                           "theory_slope_rho": THEORY_SLOPE,
                           "heads": {role: len({(r["model"], r["layer"], r["head"]) for r in rows
                                                if r["role"] == role and r["method"] == "rpka"
                                                and r["eps"] == EPSILONS[0]})
                                     for role in ROLES},
                           "tracks": {role: sorted({r["track"] for r in rows if r["role"] == role})
                                      for role in ROLES}}  # fmt: skip
    for method in METHODS:
        fit_rows = [r for r in rows if r["method"] == method and r["role"] == "fit"]
        held = [r for r in rows if r["method"] == method and r["role"] == "held_out"]
        if len(fit_rows) < 2:
            continue
        fit = fit_method(fit_rows, bootstrap=bootstrap)
        out["fit"][method] = fit
        out["secondary"][method] = {s: fit_method(fit_rows, s, bootstrap=0)
                                    for s in RHO_STATISTICS[1:]}  # fmt: skip
        out["held_out"][method] = held_out_reading(fit, fit_rows, held, bootstrap)
        if planted:
            own = [r for r in planted["rows"] if r["method"] == method]
            out["planted"][method] = fit_method(own, bootstrap=bootstrap)
        if log is not None:
            named = dict(zip(["b0", *fit["terms"]], np.round(fit["coef"], 3), strict=True))
            log(f"{method}: coef {named}"
                f" sigma {fit['sigma']:.2f}; held-out {out['held_out'][method].get('held')} "
                f"{out['held_out'][method].get('median_abs_log2_error')}")  # fmt: skip
    extra = [r for r in rows if r["role"] == "extra"]
    if extra:
        out["enlarged"] = enlarged(rows, out["fit"], bootstrap)
    if frontier is not None:
        out["trained_link"] = trained_link(rows, frontier)
    out["pivoting"] = pivoting_paired(registered)
    out["points"] = [{"track": r["track"], "role": r["role"], "model": r["model"], "n": r["n"],
                      "d_head": r["d_head"], "rho_bound": r["rho_bound"], "method": r["method"],
                      "eps": r["eps"], "observed": observed(r), "full_rank": r["full_rank"]}
                     for r in rows if r["eps"] == FIGURE_EPS]  # fmt: skip
    return out


def enlarged(
    rows: Sequence[dict[str, Any]], fits: dict[str, Any], bootstrap: int = BOOTSTRAP
) -> dict[str, Any]:
    """The documented deviation (docs/rank_law.md, "Law v2: deviation"): per method the fit
    on the fit set plus the ``extra`` rows (other arms' models), the held-out tracks read by
    the same rule, and the registered fit's median signed log2(predicted / observed) on the
    ``extra`` rows (> 0: the registered law over-predicts the rank those heads need); beside
    the intervals clustered by model, ``ci_by_seed``: clustered by (track, seed), every arm's
    model of one seed resampled together (they share initialisation and data)."""
    out: dict[str, Any] = {"fit": {}, "held_out": {}, "registered_on_extra": {}, "ci_by_seed": {}}
    for method in fits:
        own = [r for r in rows if r["method"] == method]
        fit_rows = [r for r in own if r["role"] in ("fit", "extra")]
        extra = [r for r in own if r["role"] == "extra"]
        held = [r for r in own if r["role"] == "held_out"]
        fit = fit_method(fit_rows, bootstrap=bootstrap)
        out["fit"][method] = fit
        # another arm's model shares its seed (init, data) with exact's: resampled together
        by_seed = [{**r, "model": f"{r['track']}/{r['seed']}"} for r in fit_rows]
        out["ci_by_seed"][method] = fit_method(by_seed, bootstrap=bootstrap)["ci"]
        out["held_out"][method] = held_out_reading(fit, fit_rows, held, bootstrap)
        signed = np.log2(predicted(fits[method], extra) / [observed(r) for r in extra])
        out["registered_on_extra"][method] = {
            "median_signed_log2": float(np.median(signed)),
            "median_abs_log2": float(np.median(np.abs(signed))), "rows": len(extra),
        }  # fmt: skip
    return out


def r_star_bracket(entry: dict[str, Any]) -> tuple[int, int] | None:
    """A frontier entry's trained r* as the bracket (largest RPKA rank tried below it, r*]
    (0 where r* is the lowest rank tried: only r* <= that rung is known); None: not reached."""
    r_star = entry.get("r_star")
    if r_star is None:
        return None
    tried = [r["rank"] for r in entry["rows"] if r["method"] == "rpka" and r["rank"] < r_star]
    return max(tried, default=0), int(r_star)


def trained_link(rows: Sequence[dict[str, Any]], frontier: dict[str, Any]) -> dict[str, Any]:
    """Issue 54 item 4: does the drop-in r_eps of exact's trained heads predict the trained
    r* (``frontier.json``: the smallest RPKA rank whose trained gap is non-inferior at 0.95)?
    Per track with an r* and measured heads (exact's models, RPKA's rows), per eps: the
    median over heads of the observed r_eps (the rung that reached eps), and the median
    over models of the largest head's; per eps the median over tracks of |log2 (median
    r_eps / r*)| and Spearman's correlation across tracks (weak: a handful of tracks)."""
    own = [r for r in rows if r["method"] == "rpka" and r.get("arm", "exact") == "exact"]
    tracks = sorted({r["track"] for r in own} & set(frontier.get("tracks", {})))
    per_track, per_eps = {}, {}
    for track in tracks:
        bracket = r_star_bracket(frontier["tracks"][track])
        if bracket is None:
            continue
        entry: dict[str, Any] = {"r_star": bracket[1], "r_star_above": bracket[0]}
        for eps in EPSILONS:
            mine = [r for r in own if r["track"] == track and r["eps"] == eps]
            largest = [max(observed(r) for r in mine if r["model"] == m)
                       for m in sorted({r["model"] for r in mine})]  # fmt: skip
            entry[str(eps)] = {"median_head": float(np.median([observed(r) for r in mine])),
                               "largest_head": float(np.median(largest)),
                               "heads": len(mine)}  # fmt: skip
        per_track[track] = entry
    for eps in EPSILONS:
        for stat in ("median_head", "largest_head"):
            ours = np.array([e[str(eps)][stat] for e in per_track.values()])
            star = np.array([e["r_star"] for e in per_track.values()])
            if not len(ours):
                continue
            rho = stats.spearmanr(ours, star).statistic if len(ours) >= 3 else math.nan
            per_eps[f"{eps}/{stat}"] = {
                "eps": eps, "statistic": stat,
                "median_abs_log2": float(np.median(np.abs(np.log2(ours / star)))),
                "median_signed_log2": float(np.median(np.log2(ours / star))),
                "spearman": None if not math.isfinite(rho) else float(rho),
            }  # fmt: skip
    best = min(per_eps.values(), key=lambda e: e["median_abs_log2"], default=None)
    return {"tracks": per_track, "per_eps": per_eps, "best": best,
            "what": "drop-in r_eps of exact's heads (RPKA) against the trained r*"}  # fmt: skip


def write_law_v2(
    results: str | Path, bootstrap: int = BOOTSTRAP, log: Callable[[str], None] | None = print
) -> dict[str, Any]:
    """:func:`law_v2` of ``<results>/heads.json`` (and ``planted_heads.json`` if there),
    written into ``<results>/rank_law.json`` under ``law_v2``."""
    heads_path = Path(results) / HEADS_FILE
    if not heads_path.exists():
        raise FileNotFoundError(f"{heads_path} is missing: run python -m rpka rank-law heads")
    planted_path = Path(results) / PLANTED_HEADS_FILE
    planted = read_json(planted_path) if planted_path.exists() else None
    frontier_path = resolve(TRAINED_FRONTIER)
    frontier = read_json(frontier_path) if Path(frontier_path).exists() else None
    result = law_v2(read_json(heads_path), planted, bootstrap, log, frontier)
    index_path = Path(results) / INDEX_FILE
    index = read_json(index_path) if index_path.exists() else {}
    write_result_json(index_path, {**index, "law_v2": result})
    return result
