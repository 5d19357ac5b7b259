"""train_run: determinism, divergence handling, scoring, bad configurations."""

import json
import math

import pytest
import torch

from rpka.config.presets import get_preset
from rpka.model import TransformerTiny
from rpka.training.run_config import derive_seed, make_run_config, run_id
from rpka.training.train import member_batches, train_run

SMOKE = get_preset("smoke", train={"epochs": 2})


def run(tmp_path, arm="exact", lr=3e-3, seeds=(0, 1), split="val", config=SMOKE):
    rc = make_run_config(config, config.arm(arm), lr, list(seeds), split, str(tmp_path))
    return train_run(rc)


def strip_timing(result):
    out = dict(result)
    for key in ("wall_s", "cpu_s", "step_ms_median"):
        out.pop(key)
    return out


@pytest.mark.parametrize("arm", ["exact", "rpka-r4"])
def test_same_seeds_give_identical_results(tmp_path, arm):
    a, b = run(tmp_path, arm), run(tmp_path, arm)
    assert strip_timing(a) == strip_timing(b)
    json.dumps(a, allow_nan=False)  # JSON-able, non-finite values already None
    member = a["members"][0]
    assert member["status"] == "ok" and len(member["val_mse"]) == SMOKE.design.train.epochs
    assert a["scores"]["mse"] == [m["final"]["val"]["mse"] for m in a["members"]]
    assert a["step_ms_median"] > 0
    if arm.startswith("rpka"):
        assert a["guard_counts"]["rows"] > 0
    else:
        assert a["guard_counts"] is None


def test_other_seed_changes_the_result(tmp_path):
    assert run(tmp_path, seeds=(0,))["scores"] != run(tmp_path, seeds=(5,))["scores"]


def test_data_order_is_per_member():
    gens = [torch.Generator().manual_seed(s) for s in (0, 1)]
    batches = member_batches(100, 16, gens)
    assert batches.shape == (6, 2, 16)
    solo = member_batches(100, 16, [torch.Generator().manual_seed(1)])
    assert torch.equal(batches[:, 1], solo[:, 0])  # member 1 unaffected by member 0
    assert not torch.equal(batches[:, 0], batches[:, 1])


def test_test_split_records_val_and_test(tmp_path):
    result = run(tmp_path, split="test")
    final = result["members"][0]["final"]
    assert set(final) == {"val", "test"}
    assert result["scores"] == {
        k: [m["final"]["test"][k] for m in result["members"]] for k in ("mse", "mae")
    }


def test_huge_learning_rate_is_recorded_as_diverged(tmp_path):
    config = get_preset("smoke", train={"epochs": 2, "grad_clip": 0.0})
    result = run(tmp_path, lr=1e8, config=config)
    assert result["n_diverged"] == 2
    for member in result["members"]:
        assert member["status"] == "diverged"
        assert member["diverged_at"]["epoch"] == 0
        assert member["final"]["val"]["mse"] is None
    assert result["scores"]["mse"] == [None, None]


def test_a_diverging_member_does_not_stop_the_other(tmp_path, monkeypatch):
    """Member 1's output turns NaN at its 3rd step; member 0 must train exactly as alone."""
    real_forward = TransformerTiny.forward
    calls = {"n": 0}

    def poisoned(self, x):
        out = real_forward(self, x)
        if self.training and self.n_members == 2:
            calls["n"] += 1
            if calls["n"] == 3:
                out = torch.cat([out[:1], out[1:] * math.nan])
        return out

    monkeypatch.setattr(TransformerTiny, "forward", poisoned)
    pair = run(tmp_path, seeds=(0, 1))
    solo = run(tmp_path, seeds=(0,))
    bad, good = pair["members"][1], pair["members"][0]
    assert bad["status"] == "diverged"
    assert bad["diverged_at"] == {"epoch": 0, "step": 2, "reason": "non-finite training loss"}
    assert bad["final"]["val"]["mse"] is None and pair["n_diverged"] == 1
    assert good["status"] == "ok"
    assert good["final"]["val"]["mse"] == pytest.approx(
        solo["members"][0]["final"]["val"]["mse"], rel=1e-5
    )
    assert all(v is not None and math.isfinite(v) for v in good["val_mse"])


def test_a_linalg_failure_in_the_attention_is_recorded_not_raised(tmp_path, monkeypatch):
    """E.g. a landmark Gram matrix float32 cannot factorise: the run ends, recorded."""
    real_forward = TransformerTiny.forward
    calls = {"n": 0}

    def failing(self, x):
        calls["n"] += 1
        if self.training and calls["n"] == 4:
            raise torch.linalg.LinAlgError(
                "linalg.cholesky: (Batch element 3): not positive-definite"
            )
        return real_forward(self, x)

    monkeypatch.setattr(TransformerTiny, "forward", failing)
    result = run(tmp_path, arm="rpka-r4", split="test")
    assert result["n_diverged"] == 2 and result["scores"]["mse"] == [None, None]
    for member in result["members"]:
        assert member["status"] == "diverged"
        assert member["diverged_at"]["reason"].startswith("LinAlgError: linalg.cholesky")
        assert member["final"]["val"]["mse"] is None
    json.dumps(result, allow_nan=False)


def test_run_id_ignores_only_result_neutral_keys(tmp_path):
    rc = make_run_config(SMOKE, SMOKE.arm("exact"), 1e-3, [0], "val", str(tmp_path))
    same = {**rc, "data_dir": "/elsewhere", "progress": {"enable": True, "position": 3}}
    assert run_id(rc) == run_id(same)
    assert run_id(rc) != run_id({**rc, "lr": 2e-3})
    assert run_id(rc) != run_id({**rc, "seeds": [1]})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"lr": -1.0}, "lr must be"),
        ({"seeds": []}, "seeds must be"),
        ({"seeds": [1, 1]}, "seeds must be"),
        ({"split": "train"}, "split must be"),
    ],
)
def test_bad_run_config_is_rejected(tmp_path, change, message):
    rc = make_run_config(SMOKE, SMOKE.arm("exact"), 1e-3, [0], "val", str(tmp_path))
    with pytest.raises(ValueError, match=message):
        train_run({**rc, **change})


def test_seed_streams_are_distinct():
    seeds = {derive_seed(0, stream) for stream in range(3)}
    assert len(seeds) == 3
