"""Why RPKA needs a high rank (rpka.kernel.spectrum): residual traces of the pivoted kernel against
the optimum and the no-structure line, and the best rank-r error of the attention matrix -
checked against numpy's own eigen- and singular values."""

import numpy as np
import pytest
import torch

from rpka import bench
from rpka.attention.rpcholesky import gaussian_kernel
from rpka.config.presets import get_preset
from rpka.io import has_checksum
from rpka.kernel.matrix import pivot_points
from rpka.kernel.spectrum import bench_spectrum, head_spectrum


def qk(n=48, d=16, std=6.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, d, generator=g, dtype=torch.float64) * std**0.5 for _ in range(2)]


def test_curves_against_numpy_and_the_no_structure_line():
    q, k = qk()
    out = head_spectrum(q, k, [8, 24, 48, 96, 500], draws=2)
    assert out["ranks"] == [8, 24, 48, 96]  # above N = 96 points: dropped
    points = pivot_points(q[None], k[None])[0]
    eig = np.sort(np.linalg.eigvalsh(gaussian_kernel(points, points).numpy()))[::-1]
    for r, value in zip(out["ranks"], out["residual_optimal"], strict=True):
        assert value == pytest.approx(eig[r:].sum() / eig.sum(), abs=1e-9)
    sv = np.linalg.svd(torch.softmax(q @ k.T / 4, -1).numpy(), compute_uv=False)
    for r, value in zip(out["ranks"], out["attention_error"], strict=True):
        assert value == pytest.approx(np.sqrt((sv[r:] ** 2).sum() / (sv**2).sum()), abs=1e-9)
    assert out["no_structure"] == [1 - r / 96 for r in out["ranks"]]
    for rule in ("rpc", "uniform"):  # no pivoting rule beats the optimum; full rank: 0
        curve = np.array(out[f"residual_{rule}"])
        assert (curve >= np.array(out["residual_optimal"]) - 1e-9).all()
        assert curve[-1] == pytest.approx(0.0, abs=1e-9)
    assert out["logit_std"] == pytest.approx(float((q @ k.T / 4).std()))


def test_sharp_random_heads_have_no_kernel_structure_but_clustered_ones_do():
    """Sharp random heads sit on 1 - r/N; the figure's claim can fail: points in a few
    clusters leave almost no residual after as many pivots as clusters."""
    q, k = qk(std=6.5)
    sharp = head_spectrum(q, k, [16], draws=2)
    assert sharp["residual_rpc"][0] == pytest.approx(sharp["no_structure"][0], abs=0.02)
    centres = torch.randn(4, 16, dtype=torch.float64)
    labels = torch.arange(48) % 4
    noise = 1e-3 * torch.randn(48, 16, dtype=torch.float64)
    clustered = head_spectrum(centres[labels] + noise, centres[labels] + noise, [16], draws=2)
    assert clustered["residual_rpc"][0] < 0.01 < clustered["no_structure"][0]


def test_bench_spectrum_reads_exacts_trained_model(tmp_path):
    bench.run_bench(get_preset("smoke", "recall"), tmp_path, progress=False)
    result = bench_spectrum(tmp_path, ranks=(4, 8), items=1, draws=1)
    assert has_checksum(tmp_path / "spectrum.json") and result["track"] == "recall"
    assert result["causal"]  # recall is causal: its attention matrix is masked
    head = result["heads"][0]
    assert head["ranks"] == [4, 8] and len(head["residual_rpc"]) == 2
    assert {(h["layer"], h["head"]) for h in result["heads"]} == {(0, 0), (0, 1)}
