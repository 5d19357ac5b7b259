"""The Nystrom estimate's small helpers against their written-out definitions, bit for bit.

Issue 55 cut their op counts (a causal decoder's forward runs each a dozen times); these
tests hold the values to the plain forms they replaced.
"""

import math

import pytest
import torch

from rpka.attention.nystrom import finite_or_zero, landmark_cholesky
from rpka.attention.nystrom_chunked import KEY_LOGIT_LIMIT, too_sharp
from rpka.attention.options import all_finite
from rpka.attention.rpcholesky import gaussian_kernel

SPECIAL = [0.0, -0.0, 1.5, -2.0, math.inf, -math.inf, math.nan, 1e300, -1e-310]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_finite_or_zero_is_the_where_form_with_and_without_autograd(dtype):
    x = torch.tensor(SPECIAL, dtype=dtype)
    expected = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
    out = finite_or_zero(x)
    assert torch.equal(out, expected) and torch.equal(out.signbit(), expected.signbit())
    leaf = x.clone().requires_grad_(True)
    out = finite_or_zero(leaf)
    out.backward(torch.ones_like(out))
    assert torch.equal(out.detach(), expected)
    assert torch.equal(leaf.grad, torch.isfinite(x).to(dtype))  # zero where replaced


def _landmark_cholesky_written_out(landmarks, valid):
    lm = landmarks.to(torch.float64)
    eye = torch.eye(lm.shape[-2], dtype=torch.float64)
    sq = lm.pow(2).sum(-1, keepdim=True) / 2
    gram = torch.exp((lm @ lm.transpose(-1, -2) - sq - sq.transpose(-1, -2)).clamp(max=0.0))
    g_ss = torch.where(valid.unsqueeze(-1) & valid.unsqueeze(-2), gram, eye)
    return torch.linalg.cholesky(g_ss + 10 * torch.finfo(torch.float64).eps * eye)


@pytest.mark.parametrize("all_valid", [True, False])
def test_landmark_cholesky_is_the_written_out_factor_bit_for_bit(all_valid):
    g = torch.Generator().manual_seed(0)
    landmarks = torch.randn(3, 12, 8, generator=g) * 0.4
    valid = torch.ones(3, 12, dtype=torch.bool)
    if not all_valid:
        valid[1, 9:] = False
        landmarks[1, 9:] = 0.0
    chol = landmark_cholesky(landmarks, valid)
    assert torch.equal(chol, _landmark_cholesky_written_out(landmarks, valid))
    if not all_valid:  # identity rows (up to the jitter) where no landmark is
        assert torch.allclose(chol[1, 9:], torch.eye(12, dtype=torch.float64)[9:], atol=1e-14)


def test_landmark_cholesky_is_differentiable():
    g = torch.Generator().manual_seed(1)
    landmarks = (torch.randn(2, 6, 4, generator=g, dtype=torch.float64) * 0.5).requires_grad_()
    valid = torch.ones(2, 6, dtype=torch.bool)
    assert torch.autograd.gradcheck(lambda z: landmark_cholesky(z, valid), (landmarks,))


def test_a_gram_matrix_takes_the_norms_once_with_the_same_values():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 30, 16, generator=g)
    assert torch.equal(gaussian_kernel(x, x), gaussian_kernel(x, x.clone()))


@pytest.mark.parametrize(
    ("rho", "expected"),
    [
        ([1.0, -3.0, -math.inf, 0.0], False),
        ([1.0, -(KEY_LOGIT_LIMIT + 1), -math.inf], True),
        ([KEY_LOGIT_LIMIT + 1, math.nan], True),
        ([-math.inf, math.inf, math.nan], False),  # nothing finite: nothing too sharp
        ([], False),
    ],
)
def test_too_sharp_reads_the_finite_references_only(rho, expected):
    assert too_sharp(torch.tensor(rho, dtype=torch.float32)) is expected


@pytest.mark.parametrize(
    ("values", "expected"),
    [([1.0, 2.0], True), ([1.0, math.nan], False), ([math.inf], False), ([3e38, 3e38], True)],
)
def test_all_finite_is_the_element_wise_test(values, expected):
    # 3e38 + 3e38 overflows float32's sum: the element-wise test decides
    assert all_finite(torch.tensor(values, dtype=torch.float32)) is expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_exp_floored_is_exp_above_the_floor_and_a_normal_number_below(dtype):
    from rpka.attention.nystrom import EXP_FLOOR, exp_floored_

    floor = EXP_FLOOR[dtype]
    x = torch.tensor([0.0, -1.5, floor + 1, floor, floor - 1, -1e4, -math.inf], dtype=dtype)
    out = exp_floored_(x.clone())
    assert torch.equal(out[:4], torch.exp(x[:4]))  # unchanged where exp's result is normal
    assert torch.equal(out[4:], torch.exp(torch.full((3,), floor, dtype=dtype)))
    assert bool((out[4:] >= torch.finfo(dtype).tiny).all())  # never subnormal, never 0
