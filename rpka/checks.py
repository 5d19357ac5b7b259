"""Validation helpers shared by every configuration: one error message format,
``"<name> must be <allowed>, got <value>"``, raised before any work."""

from __future__ import annotations

import math


def require(ok: bool, name: str, allowed: str, value: object) -> None:
    """Raise ``ValueError`` naming the parameter and its allowed range unless ``ok``."""
    if not ok:
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
