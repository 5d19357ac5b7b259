"""The decoding benchmark: structure of its JSON and bad arguments (no timing asserted)."""

import pytest
import torch

from rpka.cli import commands as cli
from rpka.io import read_json
from rpka.speed import decoding

TINY = {
    "contexts": [16, 40],
    "batch_heads": 2,
    "head_dim": 8,
    "rank": 4,
    "block_size": 8,
    "warmup": 1,
    "steps": 9,  # crosses a block boundary: the fold is inside the timed steps
}


def test_writes_rows_for_every_method_and_context(tmp_path):
    out = tmp_path / "decode.json"
    argv = [f"--{key.replace('_', '-')}" for key in TINY]
    args = []
    for flag, value in zip(argv, TINY.values(), strict=True):
        args += [flag, *map(str, value if isinstance(value, list) else [value])]
    cli.decode_main([*args, "--out", str(out)])
    result = read_json(out)
    rows = result["rows"]
    assert {(r["method"], r["context"]) for r in rows} == {
        (m, n) for m in ("exact", "rpka") for n in (16, 40)
    }
    assert all(len(r["per_token_ms_all"]) == 9 and r["per_token_ms"] > 0 for r in rows)
    assert all(r["redraw_ms"] > 0 for r in rows if r["method"] == "rpka")
    assert "float32" in result["shape"] and result["device"]
    target = result["summary"]["target"]
    assert target["met"] == (max(target["ratio"], target["ratio_with_redraw"]) <= 1.2)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"contexts": []}, "contexts"),
        ({"steps": 0}, "steps"),
        ({"rank": 0}, "rank"),
        ({"dtype": "int8"}, "dtype"),
        ({"device": "tpu"}, "device"),
        ({"pivot_set": "queries"}, "pivot_set"),
        ({"contexts": [8]}, r"contexts must be >= block_size 64 .* got \[8\]"),
        ({"contexts": [300_000_000]}, r"contexts 300000000 needs at least [\d,.]+ GiB"),
    ],
)
def test_bad_config_names_the_parameter(changes, match):
    with pytest.raises(ValueError, match=match):
        decoding.DecodeConfig(**changes).validate()


def test_a_context_shorter_than_the_warm_up_run_still_runs(tmp_path):
    """The untimed warm-up prefills two blocks: with a shorter sweep (``--contexts 24
    --block-size 16``) its steps read past q, k, v - "step takes one token" (issue 31)."""
    config = decoding.DecodeConfig(**{**TINY, "contexts": [16], "block_size": 16})
    assert config.sequence_length() == 2 * 16 + 1 + 9
    rows = decoding.run_decoding(config, progress=False)["rows"]
    assert {r["context"] for r in rows} == {16}


def test_steps_of_every_context_are_timed_in_turn(monkeypatch):
    """Each round times one step of every context (a fresh order per round), so a busy
    moment of the machine falls on all contexts alike; redraws are timed REDRAW_REPEATS
    times each and their median kept."""
    steps_of: list[int] = []
    timed = decoding.timed

    def recording(fn, device):
        defaults = getattr(fn, "__defaults__", None)  # a step's lambda binds its context
        if defaults:
            steps_of.append(defaults[0])
        return timed(fn, device)

    monkeypatch.setattr(decoding, "timed", recording)
    config = decoding.DecodeConfig(**TINY)
    rows = decoding.decode_contexts("rpka", config, decoding_inputs(config))
    rounds = [set(steps_of[i : i + 2]) for i in range(0, len(steps_of), 2)]
    assert len(rounds) == TINY["warmup"] + TINY["steps"] and all(r == {16, 40} for r in rounds)
    assert len({tuple(steps_of[i : i + 2]) for i in range(0, len(steps_of), 2)}) == 2  # both orders
    for row in rows:
        assert len(row["redraw_ms_all"]) == decoding.REDRAW_REPEATS
        assert row["redraw_ms"] == sorted(row["redraw_ms_all"])[decoding.REDRAW_REPEATS // 2]


def decoding_inputs(config):
    shape = (1, config.batch_heads, config.sequence_length(), config.head_dim)
    return [torch.randn(shape) for _ in range(3)]
