"""What a latency sweep measures (``rpka.speed.scaling``): its configuration, the named sweeps
(``SCALING_PRESETS``, each with its result file ``DEFAULT_OUT``), the arms a configuration expands
into, and a sweep of a bench study's own arms at one length (``bench_arms_config``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from rpka import paths
from rpka.attention import build, options_of
from rpka.attention.rpka import IMPLEMENTATION_OPTIONS
from rpka.checks import require_memory

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
# the sweep's own arms, each named as in the registry (rpka.attention.REGISTRY); the control
# is rpka with uniform landmarks (Skyformer-like), built as rpka with pivot_rule "uniform"
BUILTIN_ARMS = ("exact", "rpka", "nystrom-uniform")
CONTROL = BUILTIN_ARMS[2]


@dataclass
class ScalingConfig:
    """One sweep: every arm at every length. See the module docstring for the measures."""

    lengths: Sequence[int] = (256, 1024, 4096)
    ranks: Sequence[int] = (4, 16, 32, 64, 128)
    control_ranks: Sequence[int] = (16, 64)
    batch_heads: int = 8
    head_dim: int = 64
    device: str = "cpu"
    dtype: str = "float32"
    warmup: int = 2
    repeats: int = 5
    # fewer repeats from this length on (long sequences are slow and stable)
    long_length: int = 32768
    long_repeats: int = 3
    backward: bool = True
    memory: bool = True
    seed: int = 0
    # SDPA backend pinned for exact (None: SDPA's own choice; "flash" on CUDA)
    exact_backend: str | None = None
    # wall-clock budget in seconds for the whole sweep; later measurements, and any one
    # predicted to overrun what is left, are "skipped"
    max_seconds: float | None = None
    # more arms, any registered method by name: {"name": label, "method": ..., "options":
    # {...}} each (e.g. a bench preset's arms, see arm_latency); measured under their name
    extra_arms: Sequence[Mapping[str, Any]] = ()

    def validate(self) -> None:
        if not self.lengths or any(_bad_int(n, 2) for n in self.lengths):
            raise ValueError(f"lengths must be integers >= 2, got {list(self.lengths)}")
        for name in ("ranks", "control_ranks"):
            if any(_bad_int(r, 1) for r in getattr(self, name)):
                raise ValueError(f"{name} must be positive integers, got {getattr(self, name)}")
        for name, low in (
            ("batch_heads", 1),
            ("head_dim", 1),
            ("warmup", 0),
            ("repeats", 1),
            ("long_length", 2),
            ("long_repeats", 1),
        ):
            if _bad_int(getattr(self, name), low):
                raise ValueError(f"{name} must be an integer >= {low}, got {getattr(self, name)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' requested but CUDA is not available")
        if self.max_seconds is not None and not self.max_seconds > 0:
            raise ValueError(f"max_seconds must be None or > 0, got {self.max_seconds!r}")
        if self.device == "cpu":  # the inputs alone, before any attention runs
            item = torch.empty((), dtype=DTYPES[self.dtype]).element_size()
            longest = max(self.lengths)
            require_memory(
                "lengths", longest, 4.0 * self.batch_heads * longest * self.head_dim * item,
                "q, k, v and the backward cotangent at the longest length",
            )  # fmt: skip
        build("exact", backend=self.exact_backend)  # validates the backend name
        builtin = set(BUILTIN_ARMS)
        names = [arm.get("name") if isinstance(arm, Mapping) else None for arm in self.extra_arms]
        for arm, name in zip(self.extra_arms, names, strict=True):
            if not isinstance(name, str) or name in builtin or names.count(name) > 1:
                raise ValueError(
                    f"extra_arms must be dicts with a unique 'name' other than {sorted(builtin)}, "
                    f"got {arm!r}"
                )
            options = dict(arm.get("options", {}))
            unknown = sorted(set(options) - set(options_of(arm.get("method", ""))))
            if unknown:
                raise ValueError(f"extra_arms {name!r}: unknown option(s) {unknown}")


def _bad_int(value: object, low: int) -> bool:
    return not isinstance(value, int) or isinstance(value, bool) or value < low


SCALING_PRESETS = {
    # this project's 2-core CPU machine
    "cpu": ScalingConfig(
        lengths=(256, 512, 1024, 2048, 4096, 8192),
        control_ranks=(4, 16, 32, 64, 128),
        batch_heads=8,
        head_dim=64,
        warmup=2,
        repeats=7,  # >= 7, the forward interleaved (issue 39)
        long_length=4096,
        long_repeats=7,
    ),
    # one H200 (or any CUDA GPU): B*H = 16, d = 64, inputs in bf16, SDPA pinned to flash
    "gpu": ScalingConfig(
        lengths=(1024, 2048, 4096, 8192, 16384, 32768, 65536),
        control_ranks=(4, 16, 32, 64, 128),
        batch_heads=16,
        head_dim=64,
        device="cuda",
        dtype="bfloat16",
        warmup=3,
        repeats=20,
        long_length=32768,
        long_repeats=7,
        exact_backend="flash",
        max_seconds=360.0,
    ),
    # seconds, for tests and smoke runs
    # the standard study's sweep (issue 28): the cpu preset's batch and head size up to the
    # lengths where RPKA's forward pays (docs/speed.md), fewer repeats - seconds, not minutes
    "standard": ScalingConfig(
        lengths=(512, 1024, 2048, 4096),
        control_ranks=(16, 64),
        batch_heads=8,
        head_dim=64,
        warmup=1,
        repeats=3,
        long_length=4096,
        long_repeats=2,
    ),
    "tiny": ScalingConfig(
        lengths=(64, 128),
        ranks=(4, 8),
        control_ranks=(4,),
        batch_heads=2,
        head_dim=16,
        warmup=1,
        repeats=2,
    ),
}
DEFAULT_OUT = {
    "cpu": paths.scaling_json("cpu"),
    "gpu": paths.GPU_SCALING_JSON,
    "tiny": paths.scaling_json("tiny"),
    "standard": paths.scaling_cpu_json("standard"),  # the standard study's own sweep
}


def arms(config: ScalingConfig) -> list[tuple[str, int | None, str, dict]]:
    """(label, rank, method, build options) of every arm, exact first."""
    exact = ("exact", None, "exact", {"backend": config.exact_backend})
    out: list[tuple[str, int | None, str, dict]] = [exact]
    out += [("rpka", int(r), "rpka", {"rank": int(r)}) for r in config.ranks]
    out += [
        (CONTROL, int(r), "rpka", {"rank": int(r), "pivot_rule": "uniform"})
        for r in config.control_ranks
    ]
    for arm in config.extra_arms:
        options = dict(arm.get("options", {}))
        out.append((arm["name"], options.get("rank"), arm["method"], options))
    return out


ARM_LENGTH = 4096  # the one long length at which a bench's arms are timed on the CPU


def bench_arms_config(
    bench_arms: Sequence[Any], length: int = ARM_LENGTH, base: ScalingConfig | None = None
) -> ScalingConfig:
    """A sweep of a bench study's arms (``ArmConfig``s or dicts) at one length, forward only.

    Every non-exact arm becomes an extra arm under its bench name, with its training
    options except RPKA's implementation options (``pivot_method``, ``block_size``,
    ``refresh``: how pivots are computed, not their law), which are left at their defaults -
    a training shape's choice (e.g. the plain pivot loop at 64 of 192 points) says nothing
    about the implementation that scales to long sequences. ``exact`` is the sweep's own
    exact row. Built on ``base`` (default: the ``cpu`` preset's shapes) without the
    default RPKA rank sweep, backward or memory.
    """
    extra = []
    for arm in bench_arms:
        arm = arm if isinstance(arm, Mapping) else asdict(arm)
        if arm["method"] != "exact":
            options = {k: v for k, v in arm["options"].items() if k not in IMPLEMENTATION_OPTIONS}
            extra.append({"name": arm["name"], "method": arm["method"], "options": options})
    return replace(
        base or SCALING_PRESETS["cpu"],
        lengths=(int(length),),
        long_length=int(length) + 1,  # one length: every arm gets the full ``repeats``
        ranks=(),
        control_ranks=(),
        extra_arms=tuple(extra),
        backward=False,
        memory=False,
    )
