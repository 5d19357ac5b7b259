"""Issue 27, phase 1: the local-window control as an arm, the two-control long-context gate,
the far-lookup track (``forecast-lookup``) and its locality, and the long-range presets."""

import dataclasses

import numpy as np
import pytest
import torch

from rpka.bench import InProcessExecutor
from rpka.config.bench import local_arm
from rpka.config.presets import get_preset
from rpka.config.presets_longctx import (
    LOCAL_WINDOW,
    LONGRANGE_PRESETS,
    get_longctx_preset,
)
from rpka.study import longctx
from rpka.tracks import get_task
from rpka.tracks.lookup import LookupConfig, codebook, generate, layout, locality
from rpka.verdict import decision, stats

SMOKE = get_longctx_preset("longrange-smoke")
EXACT = [1.0, 1.1, 0.9, 1.05, 0.95, 1.02, 0.98, 1.0]  # 8 seeds: one-sided floor 1/256


def worse(by: float) -> list[float]:
    """Per-seed values ``by`` (a fraction of exact) worse than exact, every seed."""
    return [x * (1 + by) for x in EXACT]


# --------------------------------------------------------------------------- the gate


def two_control_gate(exact, control, local, **changes):
    """The long-context gate as the bench applies it (``gate_needs_local``): each control's
    :func:`rpka.verdict.decision.control_gate`, obeyed through
    :func:`rpka.verdict.decision.verdict_gate`."""
    bench = SMOKE.bench_for(SMOKE.contexts[0])
    bench = bench.replace(eval_seeds=tuple(range(100, 108)), **changes)
    assert bench.decision.gate_needs_local
    arms = arms_of(bench, {"exact": exact, "mean-attention": control, "local-w8": local})
    uniform, window = (
        decision.control_gate(bench, arms, bench.control),
        decision.local_gate(bench, arms),
    )
    applied = decision.verdict_gate(bench, uniform, window)
    # what every reader of the report reads back from the recorded gates: the same answer
    assert decision.gate_passed(uniform, window) == applied["passed"]
    return {"passed": applied["passed"], "attention_gate": uniform, "local_gate": window}


def test_two_control_gate_passes_only_when_exact_beats_both():
    gate = two_control_gate(EXACT, worse(0.5), worse(0.4))
    assert gate["passed"] and gate["attention_gate"]["passed"] and gate["local_gate"]["passed"]
    assert gate["attention_gate"]["p_value"] == pytest.approx(1 / 256)
    assert gate["local_gate"]["control_rel"] == pytest.approx(0.4)


@pytest.mark.parametrize(
    ("control", "local", "failing"),
    [
        (worse(0.5), worse(0.0), "local_gate"),  # the local window ties with exact
        (worse(0.0), worse(0.5), "attention_gate"),  # no attention ties with exact
        (worse(0.5), worse(0.2), "local_gate"),  # significant, but < 25 % worse
        # >= 25 % worse on average but not one-sided significant (half the seeds better)
        (worse(0.5), [x * (1.9 if i % 2 else 0.9) for i, x in enumerate(EXACT)], "local_gate"),
    ],
)
def test_two_control_gate_fails_when_either_control_does(control, local, failing):
    gate = two_control_gate(EXACT, control, local)
    assert not gate["passed"]
    assert not gate[failing]["passed"]
    other = "local_gate" if failing == "attention_gate" else "attention_gate"
    assert gate[other]["passed"]


def test_two_control_gate_rejects_bad_input():
    with pytest.raises(ValueError, match="pair up"):
        two_control_gate(EXACT, worse(0.5), worse(0.5)[:-1])
    with pytest.raises(ValueError, match="min_rel"):
        two_control_gate(EXACT, worse(0.5), worse(0.5), gate_min_rel=-1)


def arms_of(config, values: dict[str, list[float]]) -> dict[str, dict]:
    return {name: {"full": {"per_seed": v}} for name, v in values.items()}


def bench_values(local: list[float]) -> dict[str, list[float]]:
    return {
        "exact": EXACT,
        "rpka-r4": worse(0.01),
        "rpka-r8": worse(0.0),
        "nystrom-uniform-r8": worse(0.02),
        "mean-attention": worse(0.5),
        "local-w8": local,
    }


@pytest.mark.parametrize(("local", "passed"), [(worse(0.5), True), (worse(0.0), False)])
def test_verdicts_need_both_gates_at_long_context(local, passed):
    bench = SMOKE.bench_for(SMOKE.contexts[0])
    bench = bench.replace(eval_seeds=tuple(range(100, 108)))
    arms = arms_of(bench, bench_values(local))
    gate = decision.compare_arms(bench, arms)
    assert gate["passed"]  # the mean control alone passes either way
    window = decision.local_gate(bench, arms)
    assert window["control_arm"] == "local-w8" and window["passed"] is passed
    assert set(window) == set(gate)  # the same fields
    for name in ("rpka-r8", "rpka-r4", "nystrom-uniform-r8"):
        verdict = arms[name]["comparison"]["verdict"]
        assert (verdict == "uninformative") is (not passed), name
    # both controls stay outside the Holm family
    assert arms["local-w8"]["comparison"]["adjustment"].startswith("none (the local")
    assert "local-w8" not in bench.secondary_arms
    assert decision.decision_of(bench)["gate_needs_local"] is True


def test_short_tracks_keep_their_gate():
    """Without gate_needs_local a local arm is reported beside the gate, not obeyed."""
    bench = SMOKE.bench_for(SMOKE.contexts[0])
    bench = bench.replace(gate_needs_local=False, eval_seeds=tuple(range(100, 108)))
    arms = arms_of(bench, bench_values(worse(0.0)))
    decision.compare_arms(bench, arms)
    assert arms["rpka-r8"]["comparison"]["verdict"] != "uninformative"
    assert not decision.local_gate(bench, arms)["passed"]
    # and a preset without a local arm has no local gate
    short = get_preset("smoke", "forecast-regimes")
    assert short.local_control is None and not short.decision.gate_needs_local
    assert decision.local_gate(short, {}) is None


def test_local_control_validation():
    bench = SMOKE.bench_for(SMOKE.contexts[0])
    no_local = bench.replace(arms=tuple(a for a in bench.design.arms if a.method != "local"))
    with pytest.raises(ValueError, match="gate_needs_local"):
        no_local.validate()
    with pytest.raises(ValueError, match="local_control_arm"):
        bench.replace(local_control_arm="mean-attention").validate()
    with pytest.raises(ValueError, match="local_control_arm"):
        bench.replace(local_control_arm="rpka-r8").validate()  # the primary
    with pytest.raises(ValueError, match="window"):
        local_arm(0)


# --------------------------------------------------------------------------- the local arm


def test_local_arm_builds_and_trains_on_any_track():
    arm = local_arm(LOCAL_WINDOW)
    assert (arm.name, arm.method, arm.options) == ("local-w128", "local", {"window": 128})
    arm.validate()
    bench = SMOKE.bench_for(SMOKE.contexts[0])
    local = bench.arm("local-w8")
    model = bench.task.build_model(
        bench.design.model, bench.design.track, [0, 1], local.method, local.options
    )
    x = torch.randn(2, 3, bench.design.track.context)
    out = model(x)
    assert out.shape == (2, 3, bench.design.track.horizon)
    out.pow(2).mean().backward()
    # a causal track too: the recall preset with the local window in it
    recall = get_preset("smoke", "recall")
    recall = recall.replace(arms=(*recall.design.arms, local_arm(8)))
    recall.validate()
    assert recall.local_control == "local-w8" and "local-w8" not in recall.secondary_arms


# --------------------------------------------------------------------------- the track

TRACK = LookupConfig(context=256, min_distance=80, n_pairs=3, n_cues=4, n_train=8, n_val=4)


def test_generate_shapes_determinism_and_answer():
    n = 50
    out = generate(TRACK, n, np.random.default_rng(3))
    again = generate(TRACK, n, np.random.default_rng(3))
    for key, value in out.items():
        np.testing.assert_array_equal(value, again[key])
    assert out["raw"].shape == (n, TRACK.context + TRACK.horizon)
    assert out["cue_start"].shape == out["cue"].shape == (n, TRACK.n_pairs)
    assert out["query"].shape == out["payload_start"].shape == out["distance"].shape == (n,)
    starts = out["cue_start"]
    assert (np.diff(starts, axis=1) >= TRACK.pair_length).all()  # no overlap
    assert starts.min() >= 0
    assert (starts.max(1) + TRACK.pair_length <= TRACK.context - TRACK.min_distance).all()
    assert (out["distance"] >= TRACK.min_distance).all()
    book = codebook(TRACK)
    rows = np.arange(n)
    raw, noise = out["raw"], 5 * TRACK.noise  # every step is its value plus N(0, noise^2)
    target = raw[:, TRACK.context :]
    payload = raw[rows[:, None], out["payload_start"][:, None] + np.arange(TRACK.horizon)]
    assert np.abs(target - payload).max() < 2 * noise  # the answer is the queried payload
    end_cue = raw[:, TRACK.context - TRACK.cue_length : TRACK.context]
    asked = book[out["cue"][rows, out["query"]]]
    assert np.abs(end_cue - asked).max() < noise
    assert (np.sort(out["cue"], 1)[:, 1:] != np.sort(out["cue"], 1)[:, :-1]).all()  # distinct


@pytest.mark.parametrize(
    ("field", "value"),
    [("n_pairs", 0), ("n_cues", 2), ("min_distance", 4), ("context", 100), ("cue_scale", 0.0)],
)
def test_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(TRACK, **{field: value}).validate()


def test_locality_against_a_direct_count():
    """The simulated distances equal those found by locating the payload in the data."""
    n, seed = 400, 11
    out = generate(TRACK, n, np.random.default_rng(seed))
    raw = out["raw"]
    target = raw[:, TRACK.context :]
    # direct: the context segment closest to the target is the payload
    segments = np.lib.stride_tricks.sliding_window_view(raw[:, : TRACK.context], TRACK.horizon, 1)
    found = ((segments - target[:, None, :]) ** 2).sum(-1).argmin(1)
    distance = (TRACK.context - 1) - (found + TRACK.horizon - 1)
    np.testing.assert_array_equal(distance, out["distance"])
    for window in (TRACK.min_distance, 150, 200):
        summary = locality(TRACK, window, n_windows=n, seed=seed)
        assert summary["share_within_window"] == pytest.approx(np.mean(distance < window))
        assert summary["median"] == pytest.approx(np.median(distance))
        assert summary["p10"] == pytest.approx(np.quantile(distance, 0.1))
        assert summary["p90"] == pytest.approx(np.quantile(distance, 0.9))
    assert locality(TRACK, TRACK.min_distance)["share_within_window"] == 0.0
    assert layout(TRACK, 5, np.random.default_rng(0))["distance"].shape == (5,)
    with pytest.raises(ValueError, match="window"):
        locality(TRACK, 0)


def test_the_track_resizes_without_moving_the_distance():
    task = get_task("forecast-lookup")
    for context in (512, 2048):
        sized = task.at_context(TRACK, context, 16, 8)
        assert sized.context == context and sized.min_distance == TRACK.min_distance
        assert (sized.n_train, sized.n_val, sized.n_test) == (16, 8, 8)


# --------------------------------------------------------------------------- the presets


def test_longrange_presets():
    config = LONGRANGE_PRESETS["longrange"]
    assert {512, 1024, 2048} <= set(config.contexts)
    for context in config.contexts:
        bench = config.bench_for(context)
        names = [a.name for a in bench.design.arms]
        assert bench.track_name == "forecast-lookup" and bench.decision.gate_needs_local
        assert bench.control == "mean-attention" and bench.local_control == "local-w128"
        assert "exact" in names and any(n.startswith("nystrom-uniform") for n in names)
        assert {"rpka-r16", "rpka-r64"} <= set(names) and bench.decision.primary_arm == "rpka-r64"
        assert len(bench.design.eval_seeds) >= 8
        assert stats.rule_can_reject(len(bench.design.eval_seeds))
        # nothing the local window (plus the embedding's reach) sees tells the answer
        reach = LOCAL_WINDOW + 2 * (bench.design.model.embed_kernel // 2)
        assert bench.design.track.min_distance >= reach
        assert locality(bench.design.track, LOCAL_WINDOW, 1000)["share_within_window"] == 0.0
    for name in LONGRANGE_PRESETS:
        assert get_longctx_preset(name) == LONGRANGE_PRESETS[name]


def test_longrange_smoke_study_reports_both_gates(tmp_path):
    result = longctx.run_longctx(
        SMOKE, tmp_path / "out", InProcessExecutor(), progress=False, data_dir=tmp_path / "c"
    )
    for context in SMOKE.contexts:
        entry = result["per_context"][str(context)]
        assert entry["local_gate"]["control_arm"] == "local-w8"
        assert entry["attention_gate"]["control_arm"] == "mean-attention"
        assert set(entry["local_gate"]) == set(entry["attention_gate"])
    arms = {r["arm"] for r in result["rows"]}
    assert {"local-w8", "mean-attention", "nystrom-uniform-r8"} <= arms


def test_rare_copies_count_the_nearest_occurrence():
    """With n_copies > 1 every pair occurs that often, far back; the distance is to the
    asked pair's nearest occurrence, as found directly in the data."""
    config = dataclasses.replace(TRACK, n_pairs=2, n_cues=2, n_copies=3)
    out = generate(config, 200, np.random.default_rng(5))
    assert (np.bincount(out["pair_of"][0], minlength=2) == 3).all()
    raw, span = out["raw"], config.pair_length
    # the asked pair as the data show it: the context's last cue, then the target
    pair = raw[:, config.context - config.cue_length :]
    segments = np.lib.stride_tricks.sliding_window_view(raw[:, : config.context], span, 1)
    error = ((segments - pair[:, None, :]) ** 2).sum(-1)
    match = error < 2.0  # copies differ by noise only (16 squares of N(0, 0.02): ~0.3)
    assert (match.sum(1) == config.n_copies).all()
    found = np.where(match, np.arange(match.shape[1]), -1).max(1)  # the nearest
    last_step = found + span - 1
    np.testing.assert_array_equal((config.context - 1) - last_step, out["distance"])
    with pytest.raises(ValueError, match="n_copies"):
        dataclasses.replace(config, n_copies=0).validate()


def test_the_gate_read_back_needs_the_attention_gate_and_any_local_one():
    passed, failed = {"passed": True}, {"passed": False}
    assert decision.gate_passed(passed, None) and decision.gate_passed(passed, passed)
    assert not decision.gate_passed(passed, failed) and not decision.gate_passed(failed, None)
    assert not decision.gate_passed(None, passed)  # no attention gate: nothing to read
