"""Validation helpers shared by every configuration: one error message format,
``"<name> must be <allowed>, got <value>"``, raised before any work."""

from __future__ import annotations

import math
import os


def require(ok: bool, name: str, allowed: str, value: object) -> None:
    """Raise ``ValueError`` naming the parameter and its allowed range unless ``ok``."""
    if not ok:
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


GiB = 2**30


def available_memory_bytes() -> int | None:
    """Memory this machine can give a new allocation now: ``MemAvailable`` of
    ``/proc/meminfo`` (Linux), else the physical memory, else None (unknown)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def require_memory(name: str, value: object, needed_bytes: float, what: str) -> None:
    """Refuse, before allocating, a size whose estimate ``needed_bytes`` (``what`` it
    counts) exceeds the memory available: a ``ValueError`` naming ``name`` and both sizes
    (the process would otherwise die of memory minutes in)."""
    available = available_memory_bytes()
    if available is not None and needed_bytes > available:
        raise ValueError(
            f"{name} {value!r} needs at least {needed_bytes / GiB:,.1f} GiB ({what}); this "
            f"machine has {available / GiB:,.1f} GiB available"
        )
