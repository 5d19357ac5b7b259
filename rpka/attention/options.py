"""Validation of the options the peer attention methods share.

Each check raises ``ValueError`` naming the option and its allowed range, before any work
(the project's rule for bad input).
"""

from __future__ import annotations

import torch


def check_positive_int(name: str, value: object) -> int:
    """``value`` must be an int >= 1 (bool is rejected: ``True`` is not a rank)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer (>= 1), got {value!r}")
    return value


def check_open_unit(name: str, value: object) -> float:
    """``value`` must be a real number in the open interval (0, 1)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 < value < 1.0:
        raise ValueError(f"{name} must lie in (0, 1), got {value!r}")
    return float(value)


def check_generator(value: object) -> torch.Generator | None:
    if value is not None and not isinstance(value, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {type(value).__name__}")
    return value


def check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def reject_causal(method: str, causal: object) -> None:
    """The peers are non-causal: landmarks or features pooled over the whole sequence."""
    if causal:
        raise ValueError(
            f"causal=True is not supported by {method!r}: it pools landmarks/features over the "
            "whole sequence, which would leak future positions; use causal=False"
        )
