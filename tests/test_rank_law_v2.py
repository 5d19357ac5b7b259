"""The rank law v2 (issue 54): the per-head measurement against torch SDPA, the rho
statistics against their definition, the interval-censored fit against a known law, and the
rank-law command's hostile findings of issue 56 (append-only predictions, one-line errors)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch.nn.functional as F

from rpka.io import read_json
from rpka.kernel import law as kernel_law
from rpka.paths import REPO_ROOT
from rpka.study.rank_law import command as rank_law_command
from rpka.study.rank_law import law, law_v2
from rpka.study.rank_law.dropin import DROPIN_FILE

# --------------------------------------------------------------------------- one head


def test_planted_head_has_the_rho_it_was_asked_for():
    """rho_bound is max ||q|| max ||k - k_bar|| / sqrt(d) (recomputed here), equal to the
    planted rho, and bounds the per-row logit range by 2 rho (|q . (k - k_bar)| <= rho)."""
    for rho, d, n, p in ((2.0, 16, 64, 1), (8.0, 32, 128, 4)):
        q, k, _ = kernel_law.planted_head(rho, d, n, p, items=2, seed=3)
        stats = kernel_law.head_statistics(q, k)
        by_hand = [float(qi.norm(dim=-1).max() * (ki - ki.mean(0)).norm(dim=-1).max() / d**0.5)
                   for qi, ki in zip(q, k, strict=True)]  # fmt: skip
        assert stats["rho_bound"] == pytest.approx(float(np.median(by_hand)), rel=1e-12)
        assert stats["rho_bound"] == pytest.approx(rho, rel=1e-9)
        assert 0 < stats["logit_range"] <= 2 * rho + 1e-9
        assert 1 <= stats["key_rank"] <= d


def test_ladder_errors_are_zero_at_full_rank_and_match_sdpa():
    """At full rank every method is exact attention (Nystrom's identity): the error against
    torch SDPA is round-off; below it, the error is the one computed by hand from the
    method's own output."""
    q, k, v = kernel_law.planted_head(2.0, 16, 32, 2, items=2, seed=0)
    q, k, v = (t.unsqueeze(1) for t in (q, k, v))  # (B, H=1, n, d)
    for method in ("rpka", "nystrom-uniform", "keys-coreset"):
        ranks = kernel_law.rank_ladder(method, 32)
        assert ranks[-1] == kernel_law.full_rank(method, 32)
        errors = kernel_law.ladder_errors(q, k, v, method, ranks)
        assert errors.shape == (len(ranks), len(kernel_law.PIVOT_SEEDS), 1)
        assert errors[-1].max() < 1e-8
        out = kernel_law._method(method, 4, 1)(q, k, v)
        exact = F.scaled_dot_product_attention(q, k, v)
        by_hand = float((out - exact).norm() / exact.norm())
        assert errors[ranks.index(4), 1, 0] == pytest.approx(by_hand, rel=1e-10)


def test_ladder_stops_once_every_head_is_below_the_smallest_eps():
    q, k, v = kernel_law.planted_head(2.0, 16, 64, 1, items=1, seed=1)
    q, k, v = (t.unsqueeze(1) for t in (q, k, v))
    ranks = kernel_law.rank_ladder("keys-coreset", 64)
    every = kernel_law.ladder_errors(q, k, v, "keys-coreset", ranks)
    stop = float(every.mean((1, 2))[2])  # the third rung's error: the ladder stops there
    errors = kernel_law.ladder_errors(q, k, v, "keys-coreset", ranks, stop_at=stop)
    assert len(errors) == 3 and np.array_equal(errors, every[:3])
    assert all(e.mean() > stop for e in errors[:-1])


def test_r_eps_interval_brackets_the_first_rank_below_eps():
    ranks = [2, 4, 8, 16]
    errors = np.array([[0.5, 0.5], [0.2, 0.1], [0.05, 0.04], [0.0, 0.0]])
    assert kernel_law.r_eps_interval(ranks, errors, 0.1) == (4, 8.0)
    assert kernel_law.r_eps_interval(ranks, errors, 0.6) == (0, 2.0)
    assert kernel_law.r_eps_interval(ranks[:3], errors[:3], 0.01) == (8, math.inf)


# --------------------------------------------------------------------------- the fit


def _ladder_rows(y: np.ndarray, x: np.ndarray, top: int = 2**9) -> list[dict]:
    """Rows whose r_eps is 2^y, bracketed by the ladder 2, 4, ..., top (right-censored)."""
    rows = []
    for yi, xi in zip(y, x, strict=True):
        rung = next((2**i for i in range(1, 10) if 2**i >= 2**yi), None)
        censored = rung is None
        rows.append({"r_lower": 0 if rung == 2 else (top if censored else rung // 2),
                     "r_upper": None if censored else rung, "censored": censored,
                     "x": xi})  # fmt: skip
    return rows


def test_interval_censored_fit_recovers_a_known_law_where_least_squares_does_not():
    """log2 r = 1 + 0.7 rho + N(0, 0.5^2), bracketed by a ladder up to 512 (about a fifth of the
    rows right-censored): the censored likelihood recovers the slope within 0.1, closer
    than least squares on the uncensored rows (v1's fit), which censoring biases low."""
    rng = np.random.default_rng(5)
    rho = rng.uniform(0, 14, 600)
    y = 1 + 0.7 * rho + rng.normal(0, 0.5, len(rho))
    rows = _ladder_rows(y, rho)
    lo, hi = law_v2.bracket(rows)
    x = np.column_stack([np.ones_like(rho), rho])
    coef, sigma = law_v2.fit_censored(x, lo, hi)
    assert 0.1 < np.isinf(hi).mean() < 0.5
    assert coef[1] == pytest.approx(0.7, abs=0.1) and coef[0] == pytest.approx(1, abs=0.5)
    assert 0.3 < sigma < 0.9
    keep = ~np.isinf(hi)
    ols, *_ = np.linalg.lstsq(x[keep], hi[keep] - 0.5, rcond=None)
    assert abs(coef[1] - 0.7) < abs(ols[1] - 0.7)


def test_held_out_rule_compares_the_law_with_both_naive_predictors():
    """A law that predicts every held-out row exactly holds; one off by a factor 8 does not."""
    fit_rows = [{"eps": e, "n": n, "full_rank": 2 * n, "censored": False, "r_upper": n / 4,
                 "r_lower": n / 8, "d_head": 16, "p": 1, "rho_bound": 1.0, "model": f"m{n}",
                 "track": "a"} for e in kernel_law.EPSILONS for n in (64, 128, 256)]  # fmt: skip
    held = [dict(r, r_upper=64.0, r_lower=32, n=1024, full_rank=2048, model="h", track="b")
            for r in fit_rows]  # fmt: skip
    exact = {"terms": [], "statistic": "rho_bound", "coef": [6.0]}  # 2^6 = 64
    assert law_v2.held_out_reading(exact, fit_rows, held, bootstrap=10)["held"] is True
    off = {"terms": [], "statistic": "rho_bound", "coef": [9.0]}
    assert law_v2.held_out_reading(off, fit_rows, held, bootstrap=10)["held"] is False


def test_predict_rank_refuses_bad_input_and_caps_at_full_rank():
    q, k, _ = kernel_law.planted_head(4.0, 16, 64, 1, items=1, seed=0)
    fit = {"rpka": {"terms": ["rho"], "statistic": "rho_bound", "coef": [1.0, 10.0]}}
    assert kernel_law.predict_rank(q[0], k[0], fit=fit) == 128  # 2^41 capped at 2n
    with pytest.raises(ValueError, match="eps"):
        kernel_law.predict_rank(q[0], k[0], eps=1.5, fit=fit)
    with pytest.raises(ValueError, match="method"):
        kernel_law.predict_rank(q[0], k[0], method="nystrom-uniform", fit=fit)
    with pytest.raises(ValueError, match="q, k"):
        kernel_law.predict_rank(q[0], k[0, :, :8], fit=fit)


# --------------------------------------------------------------------------- issue 56


def _two_cells_with_r_star(results):
    """rank-law rows for two grid cells with an r* (enough for v1's fit), no files."""
    return [{"cell": c.name, "p": c.p, "n": c.n, "d_head": c.d_head, "background": c.background,
             "learnable": True, "r_star_dropin": {m: r for m in law.METHODS}}
            for c, r in zip(law.grid_cells()[:2], (16, 32), strict=True)]  # fmt: skip


def test_predictions_are_append_only(tmp_path, monkeypatch):
    """The first prediction is held_out.json; a second goes beside it, dated, and the first
    is byte for byte the same; a cell that already has results is refused."""
    monkeypatch.setattr(law, "cell_rows", lambda results, cells: _two_cells_with_r_star(results))
    first = law.predict(tmp_path, "p1-n1024-d16-noise", "rpka")
    registered = (tmp_path / law.HELD_OUT_FILE).read_bytes()
    assert first["file"] == law.HELD_OUT_FILE
    second = law.predict(tmp_path, "p1-n4096-d16-noise", "rpka")
    assert second["file"] != law.HELD_OUT_FILE and "p1-n4096-d16-noise" in second["file"]
    assert (tmp_path / second["file"]).exists()
    assert (tmp_path / law.HELD_OUT_FILE).read_bytes() == registered
    with pytest.raises(ValueError, match="never overwritten"):
        law.predict(tmp_path, "p1-n4096-d16-noise", "rpka", when=law.datetime.fromisoformat(
            second["registered_utc"]))  # fmt: skip
    (tmp_path / "p1-n1024-d16-noise").mkdir()
    (tmp_path / "p1-n1024-d16-noise" / DROPIN_FILE).write_text("{}")
    with pytest.raises(ValueError, match="already has results"):
        law.predict(tmp_path, "p1-n1024-d16-noise", "rpka")
    assert (tmp_path / law.HELD_OUT_FILE).read_bytes() == registered


def _one_line_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        rank_law_command.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and "Traceback" not in "\n".join(err)
    return err[-1]


def test_index_of_a_missing_results_folder_is_refused(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    line = _one_line_exit_2(["index", "--results", str(missing)], capsys)
    assert "--results" in line and "no such folder" in line
    assert not missing.exists()
    line = _one_line_exit_2(["index", "--results", str(tmp_path)], capsys)
    assert "--results" in line and DROPIN_FILE in line
    assert not any(tmp_path.iterdir())


def test_dropin_of_an_empty_results_folder_is_refused(tmp_path, capsys):
    line = _one_line_exit_2(["dropin", "--results", str(tmp_path)], capsys)
    assert "--results" in line and "no trained bench" in line
    assert not any(tmp_path.iterdir())


def test_fit_v2_without_heads_is_refused(tmp_path, capsys):
    line = _one_line_exit_2(["fit-v2", "--results", str(tmp_path)], capsys)
    assert "heads.json" in line


def test_predict_on_a_cell_with_results_is_refused_by_the_command(tmp_path, capsys):
    (tmp_path / "p1-n1024-d16-noise").mkdir()
    (tmp_path / "p1-n1024-d16-noise" / DROPIN_FILE).write_text("{}")
    line = _one_line_exit_2(
        ["predict", "--cells", "p1-n1024-d16-noise", "--results", str(tmp_path)], capsys
    )
    assert "already has results" in line


# --------------------------------------------------------------------------- law v2 end to end


def _synthetic_heads(seed: int = 0) -> dict:
    """heads.json rows whose r_eps follows log2 r = 1 + 0.5 rho + 0.5 log2(1/eps) + noise,
    bracketed on each head's ladder: 6 fit models at n 64-1,024, 2 held-out at 2,048."""
    rng = np.random.default_rng(seed)
    rows = []
    models = [(f"fit/{i}", "fit", 64 * 4 ** (i % 3)) for i in range(6)]
    models += [(f"held/{i}", "held_out", 2048) for i in range(2)]
    for model, role, n in models:
        for head in range(4):
            rho = float(rng.uniform(1, 12))
            errors_u = rng.uniform(0.5, 1.5, 12)
            for method in law_v2.METHODS:
                ranks = kernel_law.rank_ladder(method, n)
                for eps in kernel_law.EPSILONS:
                    y = 1 + 0.5 * rho + 0.5 * math.log2(1 / eps) + rng.normal(0, 0.3)
                    upper = next((r for r in ranks if math.log2(r) >= y), None)
                    below = ranks[-1] if upper is None else ranks[max(ranks.index(upper) - 1, 0)]
                    lower = 0 if upper == ranks[0] else below
                    rows.append({"model": model, "track": model.split("/")[0], "role": role,
                                 "seed": int(model.split("/")[1]),
                                 "layer": 0, "head": head, "method": method, "eps": eps,
                                 "n": n, "d_head": 16, "p": 1, "rho_bound": rho,
                                 "logit_range": rho, "logit_std": rho / 4, "r_lower": lower,
                                 "r_upper": upper, "censored": upper is None,
                                 "full_rank": ranks[-1], "ranks": ranks,
                                 "errors": (errors_u[: len(ranks)] * (1 if method == "rpka" else 1.2)).tolist()})  # fmt: skip  # noqa: E501
    return {"rows": rows}


def test_law_v2_recovers_the_planted_law_and_reads_the_held_out_tracks(tmp_path):
    """On rows that follow a known law the fit finds its slope in rho inside its interval,
    the held-out reading holds (n plays no part, so r proportional to n loses), RPKA is
    lower than uniform on every head (the paired test says so), and the report renders it."""
    from rpka.report import Figures
    from rpka.report import rank_law as section

    result = law_v2.law_v2(_synthetic_heads(), None, bootstrap=20, log=None)
    fit = result["fit"]["rpka"]
    slope = fit["coef"][fit["terms"].index("rho") + 1]
    assert slope == pytest.approx(0.5, abs=0.08)
    assert fit["ci"]["rho"][0] < slope < fit["ci"]["rho"][1]
    held = result["held_out"]["rpka"]
    assert held["held"] is True and held["median_abs_log2_error"]["law"] <= 1
    assert held["median_abs_log2_error"]["proportional_to_n"] > held["median_abs_log2_error"]["law"]
    rank2 = next(r for r in result["pivoting"]["per_rank"] if r["rank"] == 2)
    assert rank2["rpka_lower"] == rank2["heads"] and rank2["wilcoxon_p"] < 0.01
    figs = Figures(figures_dir=tmp_path / "figures")
    items = section.law_v2_items({"law_v2": result}, figs)
    assert figs.count == 1 and len(items) == 2
    assert "**held**" in items[1].data and "held out" in items[1].data
    assert section.law_v2_items({}, figs) == []


# --------------------------------------------------------------------------- predict_rank


@pytest.mark.skipif(
    not (REPO_ROOT / kernel_law.LAW_FILE).exists(), reason="the committed rank_law.json"
)
def test_predict_rank_with_the_planted_law_predicts_unseen_planted_heads():
    """The planted law committed in rank_law.json (fitted on rho 1-16, d 16 / 64, n 128-512,
    p 1 / 8) predicts RPKA's r_0.03 on planted heads outside that grid (d 32, n 192 / 384,
    p 2 / 4, rho 3 / 6 / 12, fresh seeds), measured here: median |log2 predicted /
    observed| at most 1 (one ladder rung)."""
    fit = {"rpka": read_json(REPO_ROOT / kernel_law.LAW_FILE)["law_v2"]["planted"]["rpka"]}
    errors = []
    for i, (rho, n, p) in enumerate([(r, n, p) for r in (3.0, 6.0, 12.0)
                                     for n, p in ((384, 2), (192, 4))]):  # fmt: skip
        q, k, v = kernel_law.planted_head(rho, 32, n, p, items=2, seed=1000 + i)
        predicted = kernel_law.predict_rank(q, k, eps=0.03, p=p, fit=fit)
        ranks = kernel_law.rank_ladder("rpka", n)
        qkv = (t.unsqueeze(1) for t in (q, k, v))
        measured = kernel_law.ladder_errors(*qkv, "rpka", ranks, stop_at=0.03)
        _, observed = kernel_law.r_eps_interval(ranks[: len(measured)], measured[:, :, 0], 0.03)
        errors.append(abs(math.log2(predicted / observed)))
    assert float(np.median(errors)) <= 1.0


# --------------------------------------------------------------------------- the deviation


def _with_extra(shift: float = 2.0, seed: int = 1) -> tuple[dict, dict]:
    """The synthetic heads, and the same plus 'extra' models (other arms) whose r_eps sits
    ``shift`` rungs below the law: the registered fit must not see them."""
    heads = _synthetic_heads()
    extra = []
    for row in _synthetic_heads(seed)["rows"]:
        if row["role"] != "fit":
            continue
        ranks, moved = row["ranks"], {}
        if row["r_upper"] is not None:  # a censored head stays censored
            upper = ranks[max(ranks.index(int(row["r_upper"])) - int(shift), 0)]
            moved = {
                "r_upper": upper,
                "r_lower": 0 if upper == ranks[0] else ranks[ranks.index(upper) - 1],
            }
        extra.append({**row, "role": "extra", "model": "other-arm/" + row["model"],
                      "arm": "rpka-r16", **moved})  # fmt: skip
    return heads, {"rows": heads["rows"] + extra}


def test_the_enlarged_fit_sits_beside_the_registered_one_which_ignores_the_extra_heads():
    heads, enlarged_heads = _with_extra()
    alone = law_v2.law_v2(heads, None, bootstrap=5, log=None)
    both = law_v2.law_v2(enlarged_heads, None, bootstrap=5, log=None)
    assert "enlarged" not in alone
    assert both["fit"]["rpka"]["coef"] == alone["fit"]["rpka"]["coef"]  # registered: unchanged
    assert both["held_out"]["rpka"] == alone["held_out"]["rpka"]
    assert both["heads"]["extra"] == 24 and both["heads"]["fit"] == alone["heads"]["fit"]
    enlarged = both["enlarged"]
    assert enlarged["fit"]["rpka"]["models"] == 12  # six fit models + six other-arm ones
    assert enlarged["fit"]["rpka"]["coef"][0] < alone["fit"]["rpka"]["coef"][0]  # lower
    on_extra = enlarged["registered_on_extra"]["rpka"]
    # two rungs over, less where the ladder's first rung clamps the shift
    assert 1.0 < on_extra["median_signed_log2"] < 2.6
    assert enlarged["held_out"]["rpka"]["rows"] == both["held_out"]["rpka"]["rows"]
    # resampled by (track, seed): each other-arm model goes with exact's of its seed
    assert set(enlarged["ci_by_seed"]["rpka"]) == set(enlarged["fit"]["rpka"]["ci"])


def _frontier(r_stars: dict) -> dict:
    """A frontier.json: RPKA tried at 16, 32, 64, 128 on every track; r* as given."""
    return {"tracks": {t: {"r_star": r, "rows": [{"method": "rpka", "rank": k}
                                                 for k in (16, 32, 64, 128)]}
                       for t, r in r_stars.items()}}  # fmt: skip


def test_the_trained_link_reads_each_track_against_its_r_star():
    heads = _synthetic_heads()
    rows = [r for r in heads["rows"] if r["method"] == "rpka"]
    median = {eps: float(np.median([law_v2.observed(r) for r in rows
                                    if r["track"] == "fit" and r["eps"] == eps]))
              for eps in kernel_law.EPSILONS}  # fmt: skip
    # the fit track's r* equal to its median r_eps at eps 0.03: that eps fits best, exactly
    frontier = _frontier({"fit": median[0.03], "held": 4096, "absent": 64, "unreached": None})
    link = law_v2.trained_link(heads["rows"], frontier)
    assert set(link["tracks"]) == {"fit", "held"}  # measured and with an r*
    assert link["tracks"]["fit"]["0.03"]["median_head"] == median[0.03]
    assert link["tracks"]["held"]["r_star_above"] == 128  # the rung tried below 4096
    ours = link["per_eps"]["0.03/median_head"]
    held = link["tracks"]["held"]["0.03"]["median_head"]
    expected = float(np.median([0.0, abs(math.log2(held / 4096))]))
    assert ours["median_abs_log2"] == pytest.approx(expected)
    assert ours["spearman"] is None  # two tracks: no rank correlation
    assert law_v2.r_star_bracket(frontier["tracks"]["unreached"]) is None
    assert law_v2.r_star_bracket(_frontier({"t": 16})["tracks"]["t"]) == (0, 16)


def test_the_report_says_the_enlarged_fit_and_the_trained_link_apart():
    from rpka.report import rank_law as section

    _, enlarged_heads = _with_extra()
    result = law_v2.law_v2(enlarged_heads, None, bootstrap=5, log=None,
                           frontier=_frontier({"fit": 64, "held": 256, "other": 32}))  # fmt: skip
    text = section.law_v2_text(result)
    assert "**Enlarged fit** (a documented deviation, not the registered reading: 24 heads" in text
    assert "over-predicts" in text and "Drop-in to trained" in text
    assert "2 tracks make this weak evidence" in text
    assert section.law_v2_text({k: v for k, v in result.items()
                                if k not in ("enlarged", "trained_link")}).count("\n") < text.count("\n")  # fmt: skip  # noqa: E501
