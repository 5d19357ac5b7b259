"""Numbers that must not move: the committed reproducibility reference, recomputed bit for
bit (issue 38; tests/reproducibility.py), and the pinned numerics that make it possible."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import reproducibility
import torch

from rpka import numerics
from rpka.io import read_json

# this CPU vendor's entry (MKL pins a different branch per vendor: rpka.numerics)
REFERENCE = reproducibility.vendor_entry(read_json(reproducibility.REFERENCE))
NO_REFERENCE = (
    f"no reproducibility reference for {numerics.cpu_vendor()} CPUs: compute one with "
    "`.venv/bin/python tests/reproducibility.py --write` on one"
)


def _likely_cause() -> str:
    now, then = numerics.record(), REFERENCE["numerics"]
    causes = [
        f"{key}: committed {then[key]!r}, now {now[key]!r}"
        for key in ("torch", "cpu_capability", "mode", "environment")
        if then[key] != now[key]
    ]
    return (
        "; ".join(causes)
        if causes
        else "same torch, kernels and settings: a code change moved it (regenerate with "
        "`.venv/bin/python tests/reproducibility.py --write` only if that was intended), or "
        "this CPU lacks AVX2 / MKL took another code path"
    )


@pytest.fixture(scope="module")
def pinned() -> None:
    if REFERENCE is None:
        pytest.skip(NO_REFERENCE)
    if not numerics.record()["pinned"]:
        pytest.fail(f"the suite does not run pinned numerics: {numerics.record()}")


def test_the_suite_runs_pinned_numerics():
    state = numerics.record()
    assert state["pinned"], state
    assert state["cpu_capability"] == numerics.PINNED_CAPABILITY
    assert all(os.environ[k] == v for k, v in numerics.pinned_environment().items())


@pytest.mark.parametrize("case", sorted(reproducibility.ATTENTION_CASES))
def test_attention_outputs_and_gradients_are_bit_identical(case, pinned):
    torch.set_num_threads(1)
    expected = REFERENCE["attention"][case]
    actual = reproducibility.attention_case(case)
    moved = [key for key in expected if actual[key]["sha256"] != expected[key]["sha256"]]
    assert not moved, (
        f"{case}: {moved} moved (first values committed "
        f"{[expected[k]['first'] for k in moved]}, now {[actual[k]['first'] for k in moved]}). "
        f"Likely cause: {_likely_cause()}"
    )


@pytest.mark.slow
def test_smoke_bench_scores_are_bit_identical(pinned):
    torch.set_num_threads(1)
    actual = reproducibility.bench_reference()
    assert actual.keys() == REFERENCE["bench"].keys()
    moved = {run: (REFERENCE["bench"][run], s) for run, s in actual.items()
             if s != REFERENCE["bench"][run]}
    assert not moved, f"per-seed scores moved {moved}. Likely cause: {_likely_cause()}"


def test_native_mode_opts_out_and_says_so():
    """RPKA_NUMERICS=native leaves the kernels to torch and records it; a bad value is
    refused naming the variable and the allowed values."""
    code = "import rpka, json; from rpka import numerics; print(json.dumps(numerics.record()))"
    env = {k: v for k, v in os.environ.items() if k not in numerics.PINNED_ENVIRONMENT}
    out = subprocess.run([sys.executable, "-c", code], env={**env, "RPKA_NUMERICS": "native"},
                         capture_output=True, text=True, check=True).stdout
    assert '"mode": "native"' in out and '"pinned": false' in out
    bad = subprocess.run([sys.executable, "-c", "import rpka"],
                         env={**env, "RPKA_NUMERICS": "fast"}, capture_output=True, text=True)
    assert bad.returncode != 0
    assert "RPKA_NUMERICS='fast': must be one of ['pinned', 'native']" in bad.stderr


def test_an_op_before_rpka_is_warned_about():
    """torch reads its kernel choice at its first op: rpka imported after one cannot pin
    it, and says so (NumericsWarning) instead of recording pinned results."""
    code = (
        "import warnings, torch; torch.ones(2).sum(); import rpka; from rpka import numerics;"
        "warnings.simplefilter('error'); numerics.check()"
    )
    env = {k: v for k, v in os.environ.items() if k not in numerics.PINNED_ENVIRONMENT}
    probe = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    capability = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
        env=env, capture_output=True, text=True, check=True).stdout.strip()
    if capability == numerics.PINNED_CAPABILITY:
        pytest.skip("this CPU's native kernels are the pinned ones: nothing to warn about")
    assert probe.returncode != 0 and "NumericsWarning" in probe.stderr


def test_mkl_runs_the_branch_pinning_asked_for():
    """MKL honours MKL_CBWR=AVX2 on Intel CPUs only (elsewhere it silently runs its own
    choice, "CNR:AUTO"): pinning asks for the branch this vendor honours, and MKL says so."""
    assert numerics.pinned_environment("GenuineIntel")["MKL_CBWR"] == "AVX2"
    assert numerics.pinned_environment("AuthenticAMD")["MKL_CBWR"] == "COMPATIBLE"
    code = "import rpka, torch; a = torch.ones(64, 64); a @ a"
    env = {k: v for k, v in os.environ.items() if k not in numerics.PINNED_ENVIRONMENT}
    out = subprocess.run([sys.executable, "-c", code], env={**env, "MKL_VERBOSE": "1"},
                         capture_output=True, text=True, check=True)  # fmt: skip
    branch = numerics.pinned_environment()["MKL_CBWR"]
    assert f"CNR:{branch}" in out.stdout + out.stderr, (out.stdout + out.stderr)[-500:]
