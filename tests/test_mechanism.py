"""rpka.kernel.mechanism and rpka.report.figures against independent references (numpy, SVD, brute
force)."""

import itertools
import json

import matplotlib
import numpy as np
import pytest
import torch

from rpka.attention import build, nystrom_softmax, rpcholesky
from rpka.attention.nystrom import gather_points
from rpka.attention.rpka import KEYS_RATIO, balanced_frame
from rpka.io import read_json, write_json
from rpka.kernel.matrix import optimal_trace_error, pivot_points, pivoted_matrix
from rpka.kernel.mechanism import MechanismConfig, trace_identity
from rpka.kernel.quality import (
    approximation_quality,
    compare_models,
    mechanism_study,
    quality_frames,
)

matplotlib.use("Agg")


def model_qkv(layers=2, batch=1, heads=2, n=12, d=4, seed=0):
    """Attention inputs of a stand-in model: one (q, k, v) per layer, (B, H, n, d) float32."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(layers):
        q, k, v = (torch.randn(batch, heads, n, d, generator=g) for _ in range(3))
        out.append((q, k + 0.7, v))  # a key offset, so centring matters
    return out


def points_of(n_sets=2, n=10, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n_sets, n, d, generator=g, dtype=torch.float64)


def numpy_pivoted(z: np.ndarray, tau: float) -> np.ndarray:
    """A_tau / max_i e^{tau |z_i|^2} written from the exponential kernel exp(x.y) directly."""
    sq = (z**2).sum(1)
    kernel = np.exp(z @ z.T - (sq[:, None] + sq[None, :]) / 2)  # Gaussian = D^-1 exp(ZZ^T) D^-1
    root = np.exp(tau * (sq - sq.max()) / 2)
    return root[:, None] * kernel * root[None, :]


# --------------------------------------------------------------------------- the matrix


@pytest.mark.parametrize("pivot_set", ["joint", "keys"])
def test_pivot_points_are_the_points_rpka_pivots(pivot_set):
    """Same generator seed: RPKA's output equals Nystrom softmax on our points' pivots."""
    q, k, v = (x.double() for x in model_qkv(layers=1, n=16)[0])
    attn = build(
        "rpka",
        rank=6,
        pivot_set=pivot_set,
        pivot_method="plain",
        generator=torch.Generator().manual_seed(3),
    )
    points = pivot_points(q, k, pivot_set)
    pivots = rpcholesky(
        points, 6, "rpc", torch.Generator().manual_seed(3), weighting="gauss"
    ).pivots
    k_s = points[..., -k.shape[-2] :, :]
    # the queries in the same frame: alpha q~ (the joint set holds them; keys-only pivots
    # scale them by the same q/k balance as the keys, balanced_frame)
    frame = balanced_frame(q, k, key_ratio=1.0 if pivot_set == "joint" else KEYS_RATIO)
    q_s = q * frame.q_scale
    ref, _ = nystrom_softmax(q_s, k_s, v, gather_points(points, pivots), pivots >= 0)
    assert torch.allclose(attn(q, k, v), ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("weighting", "tau"), [("exp", 1.0), ("gauss", 0.0), ("tempered", 0.5)])
def test_pivoted_matrix_is_the_packages_matrix(weighting, tau):
    z = points_of(n_sets=1, n=9)[0] * 1.5
    a = pivoted_matrix(z, weighting)
    assert np.allclose(a.numpy(), numpy_pivoted(z.numpy(), tau), rtol=1e-12, atol=1e-14)
    run = rpcholesky(z, 3, "rpc", torch.Generator().manual_seed(0), weighting=weighting)
    assert run.trace[0].item() == pytest.approx(torch.trace(a).item(), rel=1e-12)


# --------------------------------------------------------------------------- trace identity


@pytest.mark.parametrize("candidates", ["package", "explicit"])
@pytest.mark.parametrize("weighting", ["gauss", "exp"])
def test_exact_expectation_equals_prediction_to_round_off(weighting, candidates):
    """Independent numpy Schur complements on the run's pivots: prediction and expectation."""
    points = points_of(n_sets=2, n=14, d=3, seed=1)
    config = MechanismConfig(
        rank=8, draws=2, weighting=weighting, monte_carlo="resample", candidate_decreases=candidates
    )
    out = trace_identity(points, config)
    tau = {"gauss": 0.0, "exp": 1.0}[weighting]
    for p in range(2):
        r = numpy_pivoted(points[p].numpy(), tau)
        for t, s in enumerate(out["pivots"][p]):
            tr = np.trace(r)
            expected = 0.0  # sum over every candidate, each Schur complement built explicitly
            for c in range(len(r)):
                if r[c, c] > 0:
                    after = r - np.outer(r[:, c], r[c, :]) / r[c, c]
                    expected += r[c, c] / tr * (tr - np.trace(after))
            assert out["predicted"][p, t] == pytest.approx((r**2).sum() / tr, rel=1e-10)
            assert out["exact"][p, t] == pytest.approx(expected, rel=1e-10)
            assert out["trace_package"][p, t] == pytest.approx(tr, rel=1e-10)
            r = r - np.outer(r[:, s], r[s, :]) / r[s, s]
    assert out["rel_error_exact"].max() < 1e-10


@pytest.mark.parametrize(
    ("weighting", "monte_carlo"), [("gauss", "replay"), ("tempered", "resample")]
)
def test_monte_carlo_mean_within_4_standard_errors(weighting, monte_carlo):
    """Package draws match the prediction at every step."""
    points = points_of(n_sets=2, n=12, d=3, seed=2)
    config = MechanismConfig(
        rank=6,
        draws=2000,
        weighting=weighting,
        monte_carlo=monte_carlo,
        candidate_decreases="package",
    )
    out = trace_identity(points, config)
    assert out["z"].shape == (2, 6)
    assert np.all(np.abs(out["z"]) <= 4), out["z"]
    assert np.all(np.abs(out["z_null"]) <= 4), out["z_null"]
    # the sample and the null standard errors agree where the decrease has a spread
    assert np.allclose(out["mc_se"], out["null_se"], rtol=0.25)


def test_monte_carlo_check_has_power_against_a_wrong_rule():
    """Uniform pivots (ignoring the residual) lower the mean decrease by many SE."""
    points = points_of(n_sets=1, n=16, d=3, seed=2) * 1.5
    config = MechanismConfig(rank=3, draws=3000, weighting="exp", monte_carlo="resample")
    out = trace_identity(points, config)
    prefix = torch.as_tensor(out["pivots"][:, :2])
    draws = 3000
    run = rpcholesky(
        points.unsqueeze(1).expand(1, draws, 16, 3),
        3,
        "uniform",
        torch.Generator().manual_seed(0),
        weighting="exp",
        first_pivots=prefix.unsqueeze(1).expand(1, draws, 2),
    )
    wrong = (run.trace[..., 2] - run.trace[..., 3]).numpy()[0]
    z = (wrong.mean() - out["predicted"][0, 2]) / (wrong.std(ddof=1) / np.sqrt(draws))
    assert abs(z) > 4, z


@pytest.mark.parametrize("candidates", ["package", "explicit"])
def test_replay_and_resample_draw_the_same_pivots(candidates):
    """One generator state, one chunk: both modes see the same Gumbel noise -> same draws."""
    points = points_of(n_sets=2, n=12, d=3, seed=4)
    base = dict(rank=5, draws=400, weighting="exp", candidate_decreases=candidates)
    replay = trace_identity(points, MechanismConfig(**base, monte_carlo="replay"))
    resample = trace_identity(points, MechanismConfig(**base, monte_carlo="resample"))
    assert np.allclose(replay["mc_mean"], resample["mc_mean"], rtol=1e-12, atol=1e-15)
    assert np.allclose(replay["mc_sd"], resample["mc_sd"], rtol=1e-9, atol=1e-15)


def test_chunked_replay_matches_the_prediction():
    """A tiny memory budget forces many chunks; the check still holds."""
    points = points_of(n_sets=1, n=10, d=2, seed=5)
    config = MechanismConfig(rank=4, draws=2000, monte_carlo="replay", batch_budget_mb=0.05)
    out = trace_identity(points, config)
    assert np.all(np.abs(out["z"]) <= 4)


# --------------------------------------------------------------------------- the optimum


def tiny_psd(n=7, rank=7, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, rank))
    return x @ x.T + np.diag(rng.uniform(0, 0.1, n))


@pytest.mark.parametrize("seed", [0, 1])
def test_optimum_equals_svd_truncation_and_beats_every_nystrom(seed):
    a = tiny_psd(seed=seed)
    ranks = list(range(0, 8))
    opt = optimal_trace_error(torch.from_numpy(a), ranks).numpy()
    u, s, vt = np.linalg.svd(a)
    for r, value in zip(ranks, opt, strict=True):
        best = u[:, :r] * s[:r] @ vt[:r]  # Eckart-Young truncation
        assert value == pytest.approx(np.trace(a - best), rel=1e-10, abs=1e-12)
        # every pivoted (Nystrom) rank-r approximation is no better
        for subset in itertools.combinations(range(len(a)), r):
            cols = a[:, subset]
            nystrom = cols @ np.linalg.pinv(a[np.ix_(subset, subset)]) @ cols.T
            assert np.trace(a - nystrom) >= value - 1e-10
    # nor is any other rank-r PSD approximation below the optimum (random projections)
    rng = np.random.default_rng(seed)
    for r in (1, 3, 5):
        for _ in range(50):
            basis, _ = np.linalg.qr(rng.standard_normal((len(a), r)))
            assert np.trace(a - basis @ basis.T @ a @ basis @ basis.T) >= opt[r] - 1e-10


# --------------------------------------------------------------------------- quality


def test_approximation_quality_tables():
    qkv = model_qkv(layers=2, heads=2, n=8, d=4)  # joint set: N = 16 points
    config = MechanismConfig(quality_ranks=(2, 4, 64), quality_seeds=4)
    quality = approximation_quality(qkv, config, progress=False)
    frames = quality_frames(quality)
    rows = frames["rows"]
    assert len(rows) == 2 * 2 * 3 * 3  # layers x heads x rules x ranks (64 capped at 16)
    assert sorted(rows["rank"].unique()) == [2, 4, 16]
    defined = rows.dropna(subset=["ratio_min"])
    assert len(defined) == 2 * 2 * 3 * 2 and (defined["ratio_min"] >= 1 - 1e-9).all()
    full = rows[rows["rank"] == 16]
    assert (full["rel_residual_max"] < 1e-10).all() and (full["output_error_max"] < 1e-9).all()
    assert (rows[rows["rule"] == "greedy"]["rel_residual_sd"] < 1e-12).all()
    low = rows[rows["rank"] == 2]
    assert (low["output_error_mean"] > 1e-3).all()
    assert (rows["rel_residual_min"] >= rows["rel_optimum"] - 1e-12).all()
    summary = frames["summary"]
    assert len(summary) == 9 and (summary["n_heads"] == 4).all()
    assert set(frames["guards"]["layer"]) == {0, 1}
    for spectrum in quality["spectra"]:
        eig = np.asarray(spectrum["eigenvalues"])
        assert eig.sum() == pytest.approx(1.0, rel=1e-10)
        assert spectrum["effective_rank"] == pytest.approx(1 / (eig**2).sum())
        assert eig[: spectrum["rank_90"]].sum() >= 0.9 > eig[: spectrum["rank_90"] - 1].sum()
    json.dumps(quality)


def test_mechanism_study_signature_and_json(tmp_path):
    qkv = model_qkv(layers=2, batch=2, heads=2, n=10, d=4)
    result = mechanism_study(
        qkv, rank=5, draws=2000, quality_ranks=(4, 8), quality_seeds=3, heads=(1,), progress=False
    )
    sig = result["mechanism_signature"]
    for key in (
        "prediction", "predicted", "observed", "relative_error", "confirmed", "trained_model",
        "rank", "max_abs_z", "max_rel_error_exact", "n_draws", "layer", "head",
    ):  # fmt: skip
        assert key in sig, key
    assert sig["confirmed"] and sig["max_abs_z"] <= 4 and sig["rank"] == 5
    # the decision is the pooled test over the Monte Carlo seeds (default 4), each a fresh run
    pooled = sig["pooled"]
    assert pooled["n_seeds"] == 4 and pooled["count"] == 4 * sig["n_tests"]
    assert sig["confirmed"] is pooled["confirmed"] and sig["per_step_rule_met"]
    assert sig["max_rel_error_exact"] < 1e-10 and sig["head"] == 1 and sig["n_heads"] == 2
    assert sig["monte_carlo"] == "resample"  # "auto" on the CPU
    assert sig["candidate_decreases"] == "package" and sig["max_rel_error_trace"] < 1e-10
    assert sig["relative_error"] == pytest.approx(
        abs(sig["observed"] - sig["predicted"]) / sig["predicted"]
    )
    assert {h["layer"] for h in result["trace_identity"]} == {0, 1}
    path = write_json(tmp_path / "mechanism.json", result)
    assert read_json(path)["mechanism_signature"]["rank"] == 5


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"rank": 0}, "rank"),
        ({"draws": 1}, "draws"),
        ({"monte_carlo": "exact"}, "monte_carlo"),
        ({"candidate_decreases": "sampled"}, "candidate_decreases"),
        ({"pivot_set": "queries"}, "pivot_set"),
        ({"weighting": "cosine"}, "weighting"),
        ({"quality_ranks": (4, 0)}, "quality_ranks"),
        ({"rules": ("rpc", "random")}, "rules"),
        ({"heads": (5,)}, "heads"),
        ({"layers": (2,)}, "layers"),
        ({"identity_item": 3}, "identity_item"),
        ({"mc_seeds": 0}, "mc_seeds"),
        ({"no_such_option": 1}, "no_such_option"),
    ],
)
def test_bad_options(options, match):
    with pytest.raises(ValueError, match=match):
        mechanism_study(model_qkv(), progress=False, **options)


def test_bad_inputs():
    with pytest.raises(ValueError, match="qkv_per_layer"):
        mechanism_study([], progress=False)
    q, k, v = model_qkv()[0]
    with pytest.raises(ValueError, match="qkv_per_layer"):
        mechanism_study([(q, k, v[..., :5, :])], progress=False)


# --------------------------------------------------------------------------- plots


def test_mechanism_figures_write_pngs(tmp_path):
    from matplotlib.figure import Figure

    from rpka.report import figures
    from rpka.report import figures_mechanism as mech

    figures.set_style()
    study = dict(rank=4, draws=50, quality_ranks=(2, 4, 8), quality_seeds=2, progress=False)
    trained = mechanism_study(model_qkv(seed=1), **study)
    init = json.loads(json.dumps(mechanism_study(model_qkv(seed=2), **study)))  # via JSON
    table = compare_models({"trained": trained, "init": init})
    assert list(table["model"].unique()) == ["trained", "init"] and len(table) == 6
    written = {
        "mechanism_trace_identity": mech.plot_trace_identity(trained, save_dir=tmp_path),
        "mechanism_residual_trace": mech.plot_residual_trace(trained, save_dir=tmp_path),
        "mechanism_output_error": mech.plot_output_error(init, save_dir=tmp_path),
        "mechanism_spectra": mech.plot_spectra({"trained": trained, "init": init}, tmp_path),
        "mechanism_trained_vs_init": mech.plot_trained_vs_init(
            {"trained": trained, "init": init}, save_dir=tmp_path
        ),
    }
    for name, fig in written.items():
        assert isinstance(fig, Figure)
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
        matplotlib.pyplot.close(fig)
    with pytest.raises(ValueError, match="layer"):
        mech.plot_trace_identity(trained, layer=9, head=0)
