"""Numbers that must not move: the committed reproducibility reference, recomputed bit for
bit (issue 38; tests/reproducibility.py), and the pinned numerics that make it possible."""

from __future__ import annotations

import json
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
    refused by the entry point in one line naming the variable and the allowed values."""
    code = (
        "import rpka.config, json; from rpka import numerics; print(json.dumps(numerics.record()))"
    )
    env = {k: v for k, v in os.environ.items() if k not in numerics.PINNED_ENVIRONMENT}
    out = subprocess.run([sys.executable, "-c", code], env={**env, "RPKA_NUMERICS": "native"},
                         capture_output=True, text=True, check=True).stdout
    assert '"mode": "native"' in out and '"pinned": false' in out
    bad = subprocess.run([sys.executable, "-m", "rpka", "summary"],
                         env={**env, "RPKA_NUMERICS": "fast"}, capture_output=True, text=True)
    assert bad.returncode == 2, bad.stderr[-500:]
    assert bad.stderr.strip() == (
        "error: RPKA_NUMERICS='fast': must be one of ['pinned', 'native']"
    ), bad.stderr[-500:]


def test_importing_the_library_leaves_the_process_alone():
    """Issue 52: `import rpka`, `rpka.attention` and `rpka.swap` change no environment
    variable and no kernel choice of the user's process; torch then runs the same kernels
    as in a process that never imported rpka."""
    code = (
        "import os, json; before = dict(os.environ);"
        "import rpka, rpka.attention, rpka.swap, torch; a = torch.ones(64, 64); a @ a;"
        "print(json.dumps({'changed': sorted(k for k in set(before) | set(os.environ)"
        " if before.get(k) != os.environ.get(k)),"
        " 'capability': torch.backends.cpu.get_cpu_capability()}))"
    )
    env = {k: v for k, v in os.environ.items() if k not in numerics.PINNED_ENVIRONMENT}
    out = json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                    text=True, check=True).stdout)  # fmt: skip
    native = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
        env=env, capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert out == {"changed": [], "capability": native}


def test_the_study_pins_where_it_runs():
    """The study's stages pin on import before they load torch: a process that imports
    the command line first runs the pinned numerics and records them as pinned."""
    code = (
        "import json; import rpka.cli.commands; from rpka import numerics;"
        "print(json.dumps(numerics.record()))"
    )
    env = {k: v for k, v in os.environ.items() if k not in numerics.PINNED_ENVIRONMENT}
    state = json.loads(subprocess.run([sys.executable, "-c", code], env=env,
                                      capture_output=True, text=True, check=True).stdout)
    assert state["pinned"] is True and state["pinned_late"] == []
    assert state["environment"] == numerics.pinned_environment()
    assert state["mkl_branch"] == numerics.pinned_environment()["MKL_CBWR"]


def test_an_op_before_the_study_is_recorded_as_not_pinned():
    """Issue 56's campaign: torch ran a matmul, then the study was imported and run. The
    environment is pinned too late to be sure what MKL and oneDNN run, so the record says
    pinned: false and the entry point's check warns - never what was asked as what ran."""
    code = (
        "import warnings, json, torch; a = torch.ones(64, 64); a @ a;"
        "import rpka.cli.commands; from rpka import numerics;"
        "print(json.dumps(numerics.record())); warnings.simplefilter('error'); numerics.check()"
    )
    env = {k: v for k, v in os.environ.items() if k not in numerics.PINNED_ENVIRONMENT}
    probe = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    state = json.loads(probe.stdout.splitlines()[0])
    assert state["pinned"] is False and "torch" in state["pinned_late"]
    assert probe.returncode != 0 and "NumericsWarning" in probe.stderr
    assert "loaded before the numerics were pinned" in probe.stderr


def test_mkl_runs_the_branch_pinning_asked_for():
    """MKL honours MKL_CBWR=AVX2 on Intel CPUs only (elsewhere it silently runs its own
    choice, "CNR:AUTO"): pinning asks for the branch this vendor honours, and MKL says so."""
    assert numerics.pinned_environment("GenuineIntel")["MKL_CBWR"] == "AVX2"
    assert numerics.pinned_environment("AuthenticAMD")["MKL_CBWR"] == "COMPATIBLE"
    code = "from rpka import numerics; numerics.pin(); import torch; a = torch.ones(64, 64); a @ a"
    env = {k: v for k, v in os.environ.items() if k not in numerics.PINNED_ENVIRONMENT}
    out = subprocess.run([sys.executable, "-c", code], env={**env, "MKL_VERBOSE": "1"},
                         capture_output=True, text=True, check=True)  # fmt: skip
    branch = numerics.pinned_environment()["MKL_CBWR"]
    assert f"CNR:{branch}" in out.stdout + out.stderr, (out.stdout + out.stderr)[-500:]
