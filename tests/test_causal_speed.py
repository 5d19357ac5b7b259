"""Issue 55: the faster causal forward is the old one bit for bit (outputs, q/k/v gradients,
guard counts), against the frozen copy in ``tests/causal_v1.py``, on the lm track's shapes
and on long ones, with guards idle and firing."""

import importlib.util
import sys
from pathlib import Path

import causal_v1
import pytest
import torch
import torch.nn.functional as F

from rpka.attention import build, causal
from rpka.attention.causal import causal_forward, running_range, scaled
from rpka.attention.causal_landmarks import ACCELERATE_FROM_POINTS, LandmarkSampler
from rpka.attention.rpka import CAUSAL_BLOCK
from rpka.io import read_json


def inputs(n, d=16, bh=(2, 2), dtype=torch.float32, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*bh, n, d, generator=g, dtype=dtype) * scale for _ in range(3)]


def run(forward, xs, block, rank, pivot_set, seed=0):
    xs = [x.clone().requires_grad_(True) for x in xs]
    sampler = LandmarkSampler(
        rank, "rpc", pivot_set, "gauss", 0.5, torch.Generator().manual_seed(seed)
    )
    out, guards = forward(*scaled(*xs), block, sampler, 1e-6)[:2]
    out.sin().sum().backward()
    return out.detach(), [x.grad for x in xs], {k: int(v) for k, v in guards.items()}


# (n, block, rank, pivot_set, scale): the lm track's and the swap audit's shapes (64 tokens,
# block 16; every landmark epoch spans <= 2 blocks and every pool < 256 points), sharp
# inputs with a partial last block (guards fire)
BITWISE = [
    (64, 16, 4, "joint", 1.0),
    (64, 16, 16, "joint", 1.0),
    (64, 16, 32, "joint", 1.0),
    (64, 16, 64, "joint", 1.0),
    (64, 16, 96, "joint", 1.0),
    (33, 8, 4, "joint", 1.0),
    (32, 8, 4, "keys", 1.0),
    (45, 16, 8, "keys", 30.0),
]
# longer: epochs of > 2 blocks, whose moments are now merged one block at a time (the
# decoder's order) instead of by the Hillis-Steele scan - round-off moves, nothing else
LONG = [(200, 8, 8, "joint", 3.0), (300, 16, 16, "keys", 1.0), (512, 16, 32, "joint", 1.0)]
RTOL = {torch.float32: 1e-5, torch.float64: 1e-13}


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("n", "block", "rank", "pivot_set", "scale"), BITWISE)
def test_forward_and_gradients_are_the_old_path_bit_for_bit(
    n, block, rank, pivot_set, scale, dtype
):
    xs = inputs(n, dtype=dtype, scale=scale)
    new = run(causal_forward, xs, block, rank, pivot_set)
    old = run(causal_v1.causal_forward, xs, block, rank, pivot_set)
    assert torch.equal(new[0], old[0])
    for g_new, g_old in zip(new[1], old[1], strict=True):
        assert torch.equal(g_new, g_old)
    assert new[2] == old[2]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("n", "block", "rank", "pivot_set", "scale"), LONG)
def test_long_sequences_move_by_round_off_only(n, block, rank, pivot_set, scale, dtype):
    xs = inputs(n, dtype=dtype, scale=scale)
    new = run(causal_forward, xs, block, rank, pivot_set)
    old = run(causal_v1.causal_forward, xs, block, rank, pivot_set)
    assert rel(new[0], old[0]) < RTOL[dtype]
    for g_new, g_old in zip(new[1], old[1], strict=True):
        assert rel(g_new, g_old) < 10 * RTOL[dtype]
    assert new[2]["rows"] == old[2]["rows"]


@pytest.mark.parametrize(("n", "block"), [(1, 1), (7, 3), (64, 16), (65, 16), (100, 64)])
def test_running_range_is_cummin_cummax(n, block):
    v = torch.randn(2, 3, n, 5, dtype=torch.float64, requires_grad=True)
    low, high = running_range(v, block)
    ref_low = causal_v1.to_blocks(torch.cummin(v, -2).values, block)
    ref_high = causal_v1.to_blocks(torch.cummax(v, -2).values, block)
    assert torch.equal(low, ref_low) and torch.equal(high, ref_high)
    w = torch.randn_like(low)
    grads = torch.autograd.grad((low * w).sum() + (high * w.flip(-1)).sum(), v)[0]
    ref = torch.autograd.grad((ref_low * w).sum() + (ref_high * w.flip(-1)).sum(), v)[0]
    assert torch.equal(grads, ref)


# ----------------------------------------------------------------------------- fused path


def causal_rpka(rank, block, pivot_set="joint", seed=0):
    g = torch.Generator().manual_seed(seed)
    return build(
        "rpka", rank=rank, causal=True, causal_block=block, pivot_set=pivot_set, generator=g
    )


@pytest.fixture
def fused_everywhere(monkeypatch):
    monkeypatch.setattr(causal, "FUSED_FROM_POSITIONS", 1)


def reference_path(monkeypatch):
    monkeypatch.setattr(causal, "FUSED_FROM_POSITIONS", 10**9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("n", "block", "rank", "pivot_set"),
    [(300, 16, 16, "joint"), (257, 8, 64, "keys"), (130, 64, 8, "joint")],
)
def test_fused_local_part_moves_round_off_only(monkeypatch, n, block, rank, pivot_set, dtype):
    xs = inputs(n, dtype=dtype, scale=2.0)
    with torch.no_grad():
        monkeypatch.setattr(causal, "FUSED_FROM_POSITIONS", 1)
        fused_attn = causal_rpka(rank, block, pivot_set)
        fused = fused_attn(*xs)
        reference_path(monkeypatch)
        ref_attn = causal_rpka(rank, block, pivot_set)
        ref = ref_attn(*xs)
    assert rel(fused, ref) < RTOL[dtype]
    assert fused_attn.guard_counts["rows"] == ref_attn.guard_counts["rows"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("pivot_set", ["joint", "keys"])
def test_fused_path_at_full_rank_is_exact_causal_sdpa(fused_everywhere, pivot_set, dtype):
    q, k, v = inputs(96, dtype=dtype)
    with torch.no_grad():
        out = causal_rpka(2 * 96, 8, pivot_set)(q, k, v)
    exact = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert rel(out, exact) < RTOL[dtype]


@pytest.mark.parametrize("pivot_set", ["joint", "keys"])
def test_fused_path_and_accelerated_pivots_do_not_leak(fused_everywhere, pivot_set):
    # 320 positions, block 8: pools reach 640 points, past ACCELERATE_FROM_POINTS
    q, k, v = inputs(320, dtype=torch.float32)
    with torch.no_grad():
        out = causal_rpka(16, 8, pivot_set)(q, k, v)
        for t in (0, 7, 8, 130, 255, 256, 300):
            g = torch.Generator().manual_seed(t)
            changed = [x.clone() for x in (q, k, v)]
            for x in changed:
                x[..., t + 1 :, :] = 3 * torch.randn(x[..., t + 1 :, :].shape, generator=g)
            new = causal_rpka(16, 8, pivot_set)(*changed)
            assert torch.equal(new[..., : t + 1, :], out[..., : t + 1, :]), t


def test_the_fused_path_is_inference_only(fused_everywhere):
    q, k, v = (x.requires_grad_(True) for x in inputs(200, scale=30.0))
    assert not causal.LocalPart.takes_fused(q, k, v)
    out = causal_rpka(16, 16)(q, k, v)
    out.square().mean().backward()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))
    with torch.no_grad():
        assert causal.LocalPart.takes_fused(q, k, v)
        assert torch.isfinite(causal_rpka(16, 16)(q, k, v)).all()


def test_long_pools_take_the_accelerated_pivots_and_plain_is_kept_on_request():
    sampler = LandmarkSampler(8, "rpc", "keys", "gauss", 0.5, torch.Generator().manual_seed(0))
    points = torch.randn(2, ACCELERATE_FROM_POINTS, 4)
    plain = sampler.pivots(points)
    again = LandmarkSampler(8, "rpc", "keys", "gauss", 0.5, torch.Generator().manual_seed(0))
    assert torch.equal(again.pivots(points), plain)  # pivot_method "plain": the compiled loop
    fast = LandmarkSampler(
        8, "rpc", "keys", "gauss", 0.5, torch.Generator().manual_seed(0), pivot_method="accelerated"
    ).pivots(points)
    assert fast.shape == plain.shape and ((fast >= 0) & (fast < points.shape[-2])).all()
    for row in fast.flatten(0, -2):
        assert row.unique().numel() == row.numel()  # distinct pivots


# ----------------------------------------------------------------------------- benchmark


def bench_module():
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location(
        "bench_causal", root / "scripts" / "bench_causal.py"
    )
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    return bench


def test_bench_causal_smoke_run_writes_every_measure(tmp_path):
    bench = bench_module()
    out = tmp_path / "causal.json"
    bench.main(["--smoke", "--out", str(out)])
    saved = read_json(out)
    assert saved["causal_block"] == CAUSAL_BLOCK and saved["threads"] == 1
    arms = {(r["n"], r["arm"]) for r in saved["forward"]}
    assert arms == {(n, a) for n in (128, 256) for a in (bench.EXACT, "rpka-r64", "rpka-r16")}
    for row in saved["forward"]:
        assert row["cpu_ms"] > 0 and len(row["cpu_ms_all"]) == 1
        if row["arm"] != bench.EXACT:
            assert row["measured_over_ideal"] == pytest.approx(
                row["flop_ideal_speedup"] / row["speedup_cpu"]
            )
    assert {r["arm"] for r in saved["forward_backward"]} == {bench.EXACT, "rpka-r64"}
    sharp = {r["arm"]: r for r in saved["forward_sharp"]}
    assert set(sharp) == {bench.EXACT, "rpka-r64"} and sharp["rpka-r64"]["logit_std"] == 3.0
    for key in ("peak_memory", "peak_memory_train"):
        assert {r["arm"] for r in saved[key]} == {bench.EXACT, "rpka-r64"}
        assert all(r["peak_mib"] > 0 for r in saved[key])
    for key in ("decoder", "decoder_train"):  # the forward, and one training step
        swapped = next(r for r in saved[key] if r["arm"] == "rpka-r64")
        assert swapped["sdpa_calls_served"] > 0 and swapped["sdpa_calls_passed"] == 0
    pytest.importorskip("transformers")  # the hf extra: a GPT-2 built from its config
    for key in ("hf_gpt2", "hf_gpt2_train"):
        rows = {r["arm"]: r for r in saved[key]}
        assert set(rows) == {"exact", "rpka-r64"} and rows["exact"]["model"] == "transformers GPT-2"
        assert rows["rpka-r64"]["sdpa_calls_served"] > 0  # every layer's call, every repeat


def test_flop_ideal_grows_with_length_and_falls_with_rank():
    bench = bench_module()
    assert bench.flop_ideal_speedup(8192, 64, 256) == pytest.approx(
        2 * bench.flop_ideal_speedup(4096, 64, 256)
    )
    assert bench.flop_ideal_speedup(4096, 16, 256) > bench.flop_ideal_speedup(4096, 64, 256)


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--repeats", "3"], "--repeats must be >= 7"),
        (["--decoder-width", "250"], "multiple of --decoder-heads"),
        (["--lengths", "0"], "positive integer"),
        (["--warmup", "-1"], "--warmup must be >= 0"),
        (["--sharp-std", "0"], "--sharp-std must be > 0"),
    ],
)
def test_bench_causal_refuses_bad_arguments(tmp_path, capsys, argv, match):
    with pytest.raises(SystemExit):
        bench_module().main(["--out", str(tmp_path / "x.json"), *argv])
    assert match in capsys.readouterr().err


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_decoding_after_a_fused_prefill_follows_the_forward(fused_everywhere, dtype, tol):
    # 400 positions, block 16: pools of the later draws exceed ACCELERATE_FROM_POINTS, and
    # the prompt (300) is prefilled on the fused path; the steps redraw at block 32
    q, k, v = inputs(400, dtype=dtype, scale=1.5)
    with torch.no_grad():
        full_attn = causal_rpka(8, 16)
        full = full_attn(q, k, v)
        attn = causal_rpka(8, 16)
        out, state = attn.prefill(q[..., :300, :], k[..., :300, :], v[..., :300, :])
        outs = [out]
        for t in range(300, 400):
            step, state = attn.step(*(x[..., t : t + 1, :] for x in (q, k, v)), state)
            outs.append(step)
    assert (torch.cat(outs, dim=-2) - full).abs().max() < tol
    assert attn.guard_counts["rows"] == full_attn.guard_counts["rows"]


@pytest.mark.parametrize("n", [1, 9, 70])
def test_running_range_gradient_with_ties_and_nan_is_cummax_s(n):
    # repeated values (ties move cummax's index) and a NaN (torch's own indices)
    g = torch.Generator().manual_seed(n)
    v = torch.randint(-3, 4, (2, n, 5), generator=g).double()
    for values in (v, torch.where(torch.arange(n).unsqueeze(-1) == n // 2, float("nan"), v)):
        x = values.clone().requires_grad_(True)
        low, high = running_range(x, 4)
        w = torch.randn(low.shape, generator=g, dtype=torch.float64)
        grad = torch.autograd.grad((low * w).sum() + (high * w).sum(), x)[0]
        y = values.clone().requires_grad_(True)
        ref_low = causal_v1.to_blocks(torch.cummin(y, -2).values, 4)
        ref_high = causal_v1.to_blocks(torch.cummax(y, -2).values, 4)
        ref = torch.autograd.grad((ref_low * w).sum() + (ref_high * w).sum(), y)[0]
        assert torch.equal(grad.nan_to_num(7.0), ref.nan_to_num(7.0))
