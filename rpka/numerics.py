"""Pinned CPU numerics: the same float results on any x86 CPU with AVX2 of one vendor.

PyTorch picks its vectorised kernels (ATen's ``CPU capability``), MKL its BLAS code path
and oneDNN its instruction set from the processor it finds. A machine with AVX-512 or AMX
and one without run different kernels, whose float sums round differently: a training
run's scores then differ in the third or fourth digit between machines, enough to flip a
seed on a task that learns abruptly. Pinning every library to its AVX2 path (which every
x86 CPU since 2013 has) makes one torch wheel give the same bits on every CPU of a
vendor; MKL honours its AVX2 branch on Intel only, so elsewhere it is pinned to its
COMPATIBLE branch (:func:`pinned_environment`, docs/reproducibility.md).

Each library reads its setting once, at its first operation (checked on torch 2.13: after
``import torch`` but before any op the environment still takes effect; after one op it no
longer does). Pinning is the study's choice, not the library's: importing ``rpka``,
``rpka.attention`` or ``rpka.swap`` changes nothing in a user's process (on an AMD EPYC
the COMPATIBLE branch makes a user's own float32 matmul ~3x slower; issue 52). The study's
entry points call :func:`pin` - ``python -m rpka`` first thing, and each study stage's
package on import (``rpka.config``, ``training``, ``bench``, ``kernel``, ``speed``,
``study``, ``report``, ``cli``), which the notebooks, workers and tests import before torch
runs an operation - and every process they start inherits the environment. :func:`record`
says what a process actually runs with, ``pinned: false`` wherever pinning came too late
to be sure (torch or numba loaded before :func:`pin` changed the environment); run files
and timing files store it, so a result made with native or unsure numerics says so.

Opt-out for speed runs: ``RPKA_NUMERICS=native`` (the libraries choose their fastest path;
results are then reproducible on this kind of CPU only). Costs, measured: docs/reproducibility.md.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import subprocess
import sys
import warnings
from typing import Any

MODE_VARIABLE = "RPKA_NUMERICS"
PINNED, NATIVE = "pinned", "native"
MODES = (PINNED, NATIVE)

# The settings that make torch 2.13's CPU wheel give the same bits on any AVX2 x86 CPU:
# ATen's kernel dispatch, MKL's conditional numerical reproducibility branch, oneDNN's
# instruction set, and numba's code generation target (the compiled pivot loop).
PINNED_ENVIRONMENT = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "NUMBA_CPU_NAME": "haswell",
}
PINNED_CAPABILITY = "AVX2"  # what torch.backends.cpu.get_cpu_capability() then reports
# MKL honours its AVX2 branch on Intel processors only: elsewhere it falls back to its own
# choice ("CNR:AUTO" under MKL_VERBOSE=1, seen on an AMD EPYC with AVX-512), so its sums
# follow that CPU. Its COMPATIBLE branch is honoured on every processor; pinning uses it
# wherever the AVX2 branch is not honoured (measured: docs/reproducibility.md).
INTEL = "GenuineIntel"
MKL_BRANCH_ELSEWHERE = "COMPATIBLE"


@functools.cache  # the processor does not change under a running process
def _cpuinfo(field: str) -> str:
    """The first ``field`` of /proc/cpuinfo ("unknown" where the platform does not say)."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.split(":", 1)[0].strip() == field:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def cpu_vendor() -> str:
    """The x86 vendor string (``GenuineIntel``, ``AuthenticAMD``; "unknown" where the
    platform does not say): MKL's reproducible branches depend on it."""
    return _cpuinfo("vendor_id")


def cpu_model() -> str:
    """The processor's model name (e.g. ``AMD EPYC 7B13``), recorded beside its vendor."""
    return _cpuinfo("model name")


# MKL_VERBOSE=1 makes MKL print the branch it really runs on each call ("CNR:AVX2",
# "CNR:COMPATIBLE", "CNR:OFF"); MKL_CBWR=AVX2 is ignored on non-Intel CPUs, so the
# environment alone does not say what ran (issue 53)
_MKL_PROBE = "import torch; x = torch.ones(8, 8); x @ x"
_MKL_BRANCH = re.compile(r"CNR:(\S+)")


@functools.cache  # one probe per process: the branch depends on the CPU and environment only
def mkl_branch() -> str:
    """The MKL branch a fresh process with this environment runs on this CPU, read from
    ``MKL_VERBOSE`` output of one matrix product ("unknown" where MKL does not say, e.g.
    a torch built without MKL). A subprocess: MKL prints it only when set before its start."""
    env = {**os.environ, "MKL_VERBOSE": "1"}
    try:
        done = subprocess.run(
            [sys.executable, "-c", _MKL_PROBE], env=env, capture_output=True, text=True,
            timeout=120, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    found = _MKL_BRANCH.search(done.stdout + done.stderr)
    return found.group(1) if found else "unknown"


def pinned_environment(vendor: str | None = None) -> dict[str, str]:
    """:data:`PINNED_ENVIRONMENT` for this CPU's vendor (default: :func:`cpu_vendor`):
    MKL's AVX2 branch on Intel, its COMPATIBLE branch elsewhere."""
    vendor = cpu_vendor() if vendor is None else vendor
    mkl = PINNED_ENVIRONMENT["MKL_CBWR"] if vendor == INTEL else MKL_BRANCH_ELSEWHERE
    return {**PINNED_ENVIRONMENT, "MKL_CBWR": mkl}


class NumericsWarning(UserWarning):
    """CPU numerics are not what the package pinned (torch ran an op before rpka loaded)."""


def mode() -> str:
    """The requested mode: ``RPKA_NUMERICS`` (``pinned`` by default, or ``native``);
    ValueError naming the variable and its allowed values for anything else."""
    requested = os.environ.get(MODE_VARIABLE, PINNED).strip().lower() or PINNED
    if requested not in MODES:
        raise ValueError(
            f"{MODE_VARIABLE}={os.environ[MODE_VARIABLE]!r}: must be one of {list(MODES)}"
        )
    return requested


# Set by pin() when it changed the environment after torch or numba had been imported: they
# may have read their settings already, so nothing this process computes counts as pinned
_LATE: list[str] = []
_LIBRARIES = ("torch", "numba")


def _environment_pinned() -> bool:
    """Whether every pinned variable holds this vendor's pinned value right now."""
    return all(os.environ.get(key) == value for key, value in pinned_environment().items())


def pin() -> str:
    """Set :func:`pinned_environment` in this process (and so in every process it starts)
    unless the mode is ``native``; returns the mode. Called by the study's entry points
    (``python -m rpka``, the study stages' packages); a user may call it before importing torch.

    Where the environment was not pinned yet and torch or numba is already imported, the
    libraries may have read their settings: :func:`record` then says ``pinned: false``."""
    requested = mode()
    if requested == PINNED and not _environment_pinned():
        loaded = [name for name in _LIBRARIES if name in sys.modules]
        if loaded and not _LATE:
            _LATE.extend(loaded)
        os.environ.update(pinned_environment())
    return requested


def record() -> dict[str, Any]:
    """What this process's numerics are, for a result file: the requested mode, torch's
    actual kernel dispatch, the pinned variables as set, the CPU (vendor and model) and
    the MKL branch it really ran, torch's version, and ``pinned``
    (True only if the mode is pinned and torch really runs its AVX2 kernels)."""
    torch = importlib.import_module("torch")  # not at module level: pin() runs before it
    capability = torch.backends.cpu.get_cpu_capability()
    requested = mode()
    expected_mkl = pinned_environment()["MKL_CBWR"]
    pinned = (
        requested == PINNED
        and capability == PINNED_CAPABILITY
        and _environment_pinned()
        and not _LATE
        and mkl_branch() in (expected_mkl, "unknown")
    )
    return {
        "mode": requested,
        "pinned": pinned,
        "pinned_late": list(_LATE),  # libraries loaded before pin() changed the environment
        "cpu_capability": capability,
        "environment": {key: os.environ.get(key) for key in PINNED_ENVIRONMENT},
        "cpu_vendor": cpu_vendor(),
        "cpu_model": cpu_model(),
        "mkl_branch": mkl_branch(),  # what MKL ran, not what was asked (MKL_CBWR)
        "torch": torch.__version__,
    }


def check() -> bool:
    """True if this process runs the pinned numerics it asked for; else a
    :class:`NumericsWarning` saying why (and False). In native mode: True, no warning."""
    if mode() == NATIVE:
        return True
    state = record()
    if not state["pinned"]:
        if state["pinned_late"]:
            why = (f"{' and '.join(state['pinned_late'])} loaded before the numerics were "
                   "pinned, so they may run their own kernels")  # fmt: skip
        elif not _environment_pinned():
            why = "this process never pinned them (importing rpka alone does not)"
        elif state["cpu_capability"] != PINNED_CAPABILITY:
            why = (f"torch dispatches {state['cpu_capability']} kernels (pinned: "
                   f"{PINNED_CAPABILITY}): it ran an operation before the numerics were pinned")
        else:
            why = f"MKL runs its {state['mkl_branch']} branch, not the pinned one"
        warnings.warn(
            f"CPU numerics are not pinned: {why}. Call rpka.numerics.pin() before importing "
            "torch (or set the variables of rpka.numerics.PINNED_ENVIRONMENT before starting "
            "Python) for results that reproduce on another CPU; results record pinned: false.",
            NumericsWarning,
            stacklevel=2,
        )
    return bool(state["pinned"])
