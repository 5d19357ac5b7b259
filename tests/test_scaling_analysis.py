"""Scaling analysis (rpka.report.tables, scaling section) on synthetic data with known answers,
and the scaling / decoding / long-context figures on committed or schema-shaped results."""

import copy
import math
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from rpka.io import read_json
from rpka.report import figures, tables
from rpka.report import figures_scaling as sp
from rpka.speed import analysis as scaling_analysis

RESULTS = Path(__file__).resolve().parent.parent / "data" / "results" / "scaling"
CPU_JSON = RESULTS / "cpu.json"
LENGTHS = [256, 512, 1024, 2048, 4096, 8192]


def scaling_result(curves: dict[tuple[str, int | None], list[float]], device="cuda") -> dict:
    """A result in the schema rpka.speed.scaling writes, forward latencies from ``curves``."""
    rows = [
        {"method": method, "rank": rank, "n": n, "forward_ms": ms, "forward_status": "ok"}
        for (method, rank), values in curves.items()
        for n, ms in zip(LENGTHS, values, strict=True)
    ]
    return {"device": "synthetic", "device_type": device, "shapes": "-", "rows": rows}


# --------------------------------------------------------------------------- slope fit


def test_slope_fit_recovers_a_power_law():
    n = np.array(LENGTHS, dtype=float)
    fit = scaling_analysis.fit_loglog_slope(n, 3e-4 * n**1.5)
    assert fit["slope"] == pytest.approx(1.5, abs=1e-12)
    assert fit["intercept"] == pytest.approx(math.log(3e-4), abs=1e-10)
    assert (fit["n_min"], fit["n_max"], fit["n_points"]) == (2048, 8192, 3)


def test_slope_fit_under_noise_and_overhead():
    rng = np.random.default_rng(0)
    n = np.repeat(np.geomspace(128, 65536, 10), 5)
    noisy = 2e-6 * n**2 * np.exp(rng.normal(0, 0.05, n.shape))  # 5 % log-normal noise
    fit = scaling_analysis.fit_loglog_slope(n, noisy)
    assert abs(fit["slope"] - 2) < 4 * fit["slope_se"] and fit["slope_se"] < 0.05
    # a constant overhead bends the small-n end; the upper half still sees the power law
    overhead = 50 + 1e-3 * n**2
    upper = scaling_analysis.fit_loglog_slope(n, overhead)["slope"]
    everything = scaling_analysis.fit_loglog_slope(n, overhead, upper=False)["slope"]
    assert abs(upper - 2) < 0.02 and everything < 1.9


def test_slope_fit_skips_missing_points_and_needs_two_lengths():
    fit = scaling_analysis.fit_loglog_slope([1, 2, 4, 8], [1, math.nan, 16, 64])
    assert fit["slope"] == pytest.approx(2) and fit["n_points"] == 2
    assert math.isnan(scaling_analysis.fit_loglog_slope([4, 4], [1, 2])["slope"])
    with pytest.raises(ValueError, match="equal length"):
        scaling_analysis.fit_loglog_slope([1, 2], [1])


def test_upper_half():
    assert scaling_analysis.upper_half([8, 1, 2, 4, 2]) == [4, 8]
    assert scaling_analysis.upper_half([1, 2, 3, 4, 5]) == [3, 4, 5]
    assert scaling_analysis.upper_half([1, 2]) == [1, 2]


# --------------------------------------------------------------------------- crossover


def test_crossover_of_a_power_law_is_found_exactly():
    """speed-up = (n / 700)^0.8 is straight on log-log: the interpolation is exact."""
    n = np.array(LENGTHS, dtype=float)
    found = scaling_analysis.find_crossover(n, (n / 700) ** 0.8)
    assert found["status"] == "crossed" and found["crossover_n"] == 1024
    assert found["crossover_n_interp"] == pytest.approx(700, rel=1e-12)


def test_crossover_interpolates_on_log_log_between_the_bracketing_points():
    # slower at 1000 (0.5x), faster at 4000 (2x): log s is linear in log n -> n* = 2000
    found = scaling_analysis.find_crossover([250, 1000, 4000], [0.1, 0.5, 2.0])
    assert found["crossover_n"] == 4000
    assert found["crossover_n_interp"] == pytest.approx(2000)


def test_crossover_edge_cases():
    assert scaling_analysis.find_crossover([1, 2, 4], [1.5, 2, 3])["status"] == "faster everywhere"
    never = scaling_analysis.find_crossover([1, 2, 4], [0.2, 0.5, 0.9])
    assert never == {"crossover_n": None, "crossover_n_interp": None, "status": "never"}
    # faster, then slower, then faster for good: the crossing is the last one
    found = scaling_analysis.find_crossover([1, 2, 4, 8], [1.2, 0.8, 1.25, 3])
    assert found["crossover_n"] == 4
    assert 2 < found["crossover_n_interp"] < 4
    # equal speed is not faster; a missing point is skipped
    assert scaling_analysis.find_crossover([1, 2, 4], [0.5, 1.0, 2.0])["crossover_n"] == 4
    assert scaling_analysis.find_crossover([1, 2, 4], [0.5, math.nan, 2.0])["crossover_n"] == 4


def test_crossover_table_and_speedups_on_a_synthetic_run():
    n = np.array(LENGTHS, dtype=float)
    exact = 1e-5 * n**2
    result = scaling_result(
        {
            ("exact", None): list(exact),
            ("rpka", 16): list(exact / (n / 500) ** 0.9),  # crosses at 500
            ("rpka", 64): list(exact / (n / 3000)),  # crosses at 3000
            ("nystrom-uniform", 16): list(exact * 2),  # never
        }
    )
    methods = ("rpka", "nystrom-uniform")
    table = scaling_analysis.crossover_table(result, methods=methods).set_index("arm")
    assert table.loc["rpka r=16", "crossover_n_interp"] == pytest.approx(500)
    assert table.loc["rpka r=64", "crossover_n_interp"] == pytest.approx(3000)
    assert table.loc["rpka r=64", "crossover_n"] == 4096
    assert table.loc["nystrom-uniform r=16", "status"] == "never"
    assert table.loc["rpka r=64", "speedup_at_largest"] == pytest.approx(8192 / 3000)
    slopes = scaling_analysis.scaling_slopes(result).set_index("arm")["slope"]
    assert slopes["exact"] == pytest.approx(2) and slopes["rpka r=64"] == pytest.approx(1)


def test_speedups_match_the_ratios_the_benchmark_wrote():
    """rpka.speed.scaling writes speedup_vs_exact itself: the table recomputes it independently."""
    result = read_json(CPU_JSON)
    frame = scaling_analysis.speedup_frame(result)
    written = {
        (r["method"], r["rank"], r["n"]): r["speedup_vs_exact"]
        for r in result["rows"]
        if r["method"] != "exact"
    }
    assert len(frame) == len(written)
    for row in frame.itertuples():
        assert row.ratio == pytest.approx(written[(row.method, int(row.rank), row.n)])


def test_bad_measure_raises():
    with pytest.raises(ValueError, match="measure"):
        scaling_analysis.scaling_slopes(read_json(CPU_JSON), "latency")


# --------------------------------------------------------------------------- long-context table


def test_longctx_table_pairs_seeds_with_exact():
    def row(arm, rank, per_seed):
        return {
            "context": 512,
            "arm": arm,
            "method": "exact" if rank is None else "rpka",
            "rank": rank,
            "test_mse_per_seed": per_seed,
            "step_ms": 10.0,
            "step_ratio_vs_exact": 1.0,
            "peak_mib": 5.0,
            "peak_ratio_vs_exact": 1.0,
        }

    exact = [0.60, 0.70, 0.65, 0.62]
    near = [0.61, 0.72, 0.64, 0.63]
    result = {"rows": [row("exact", None, exact), row("rpka-r16", 16, near)]}
    table = tables.longctx_table(result).set_index("arm")
    diffs = np.subtract(near, exact)
    assert table.loc["rpka-r16", "delta"] == pytest.approx(diffs.mean())
    half = table.loc["rpka-r16", "delta_ci_high"] - table.loc["rpka-r16", "delta"]
    from scipy import stats as scipy_stats

    se = diffs.std(ddof=1) / 2
    assert half == pytest.approx(scipy_stats.t.ppf(0.975, 3) * se)
    assert table.loc["rpka-r16", "test_mse_sd"] == pytest.approx(np.std(near, ddof=1))
    assert math.isnan(table.loc["exact", "delta"]) and table.loc["exact", "n_seeds"] == 4


# --------------------------------------------------------------------------- figures


def check_png(fig, path):
    assert isinstance(fig, Figure)
    assert path.stat().st_size > 5000
    matplotlib.pyplot.close(fig)


def test_scaling_figures_write_pngs_on_the_committed_cpu_results(tmp_path):
    figures.set_style()
    result = read_json(CPU_JSON)
    figure = sp.plot_scaling_latency(result, save_dir=tmp_path)
    check_png(figure, tmp_path / "scaling_latency_cpu.png")
    check_png(
        sp.plot_scaling_memory(result, save_dir=tmp_path), tmp_path / "scaling_memory_cpu.png"
    )
    check_png(sp.plot_speedup(result, save_dir=tmp_path), tmp_path / "scaling_speedup_cpu.png")
    fig = sp.plot_scaling_latency(result, methods=None, save_dir=tmp_path, name="all_arms")
    labels = [t.get_text() for t in fig.axes[-1].get_legend().get_texts()]
    assert any(label.startswith("nystrom-uniform r=16 (slope ") for label in labels)
    check_png(fig, tmp_path / "all_arms.png")
    with pytest.raises(ValueError, match="methods"):
        sp.plot_scaling_latency(result, methods=("performer",))


def test_scaling_figures_take_the_gpu_schema(tmp_path):
    """Same schema from a GPU run (device named, device_type cuda; some lengths OOM)."""
    figures.set_style()
    result = copy.deepcopy(read_json(CPU_JSON))
    result |= {"device": "NVIDIA H200", "device_type": "cuda", "dtype": "bfloat16"}
    for row in result["rows"]:
        if row["method"] == "exact" and row["n"] == 8192:
            for key in ("forward_ms", "fwd_bwd_ms", "peak_mib", "fwd_bwd_peak_mib"):
                row.pop(key, None)
            row["forward_status"] = "oom"
    check_png(sp.plot_speedup(result, save_dir=tmp_path), tmp_path / "scaling_speedup_gpu.png")
    check_png(
        sp.plot_scaling_latency(result, save_dir=tmp_path), tmp_path / "scaling_latency_gpu.png"
    )
    frame = scaling_analysis.speedup_frame(result)
    assert frame[frame["n"] == 8192]["ratio"].isna().all()


def decode_result() -> dict:
    """The schema of rpka.speed.decoding's JSON (branch causal), with made-up latencies."""
    contexts = [1024, 2048, 4096, 8192]
    rows = []
    for n in contexts:
        rows.append(
            {
                "method": "exact",
                "context": n,
                "prefill_ms": 1.0,
                "per_token_ms": 1e-4 * n,
                "per_token_mean_ms": 1e-4 * n,
                "per_token_max_ms": 2e-4 * n,
                "peak_mib": None,
            }
        )
        rows.append(
            {
                "method": "rpka",
                "context": n,
                "prefill_ms": 5.0,
                "per_token_ms": 0.2,
                "per_token_mean_ms": 0.21,
                "per_token_max_ms": 1.1,
                "peak_mib": None,
                "redraw_ms": 1e-4 * n,
                "amortised_redraw_ms_per_token": 1e-4,
                "guard_counts": {"denominator": 0},
            }
        )
    return {
        "config": {"contexts": contexts, "rank": 64, "device": "cpu"},
        "device": "x86_64 CPU",
        "shape": "B=1, H=16, d=64",
        "rows": rows,
    }


def test_decode_plot(tmp_path):
    figures.set_style()
    frame = scaling_analysis.decode_frame(decode_result())
    rpka = frame[frame["method"] == "rpka"]
    assert np.allclose(rpka["per_token_with_redraw_ms"], 0.2001)
    fig = sp.plot_decode_latency(decode_result(), save_dir=tmp_path)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "exact (KV cache) (slope 1.00)" in labels
    assert "rpka causal r=64 (slope 0.00)" in labels
    check_png(fig, tmp_path / "decode_latency_cpu.png")


@pytest.mark.skipif(not (RESULTS / "decode_cpu.json").exists(), reason="decoding not merged yet")
def test_decode_plot_on_the_committed_results(tmp_path):
    figures.set_style()
    fig = sp.plot_decode_latency(read_json(RESULTS / "decode_cpu.json"), save_dir=tmp_path)
    check_png(fig, tmp_path / "decode_latency_cpu.png")


def test_longctx_plot(tmp_path):
    figures.set_style()
    rng = np.random.default_rng(0)
    rows = []
    for context in (512, 2048):
        for arm, rank in (("exact", None), ("rpka-r16", 16), ("rpka-r64", 64)):
            rows.append(
                {
                    "context": context,
                    "arm": arm,
                    "method": "exact" if rank is None else "rpka",
                    "rank": rank,
                    "test_mse_per_seed": list(0.5 + rng.uniform(0, 0.1, 4)),
                    "step_ms": 10.0 + (rank or 0),
                    "step_ratio_vs_exact": None,
                    "peak_mib": 3.0,
                    "peak_ratio_vs_exact": None,
                }
            )
    fig = sp.plot_longctx({"rows": rows, "preset": "test", "device": "cpu"}, save_dir=tmp_path)
    check_png(fig, tmp_path / "longctx_training.png")
    assert isinstance(tables.longctx_table({"rows": rows}), pd.DataFrame)
