"""The pre-registered long-range study's answer in words (issue 40): per length the cheapest
robustly non-inferior arm with its CPU step ratio, and n* per method as far as the study has
been read (``rpka.verdict.robustness.longrange_answer``).

Below the README's summary (``rpka.report.readme``) and the report's long-range parts alike,
so both say the answer in the same words; plain formatting only (arm names in code spans).
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from rpka.attention import method_label

NA = "n/a"


def _words(text: str) -> str:
    """Data text outside code spans, for Markdown or HTML (as ``rpka.report.text.esc``)."""
    return html.escape(text, quote=False)


def lengths_text(values: list[int]) -> str:
    """1,024, 2,048 and 4,096 (n/a: none)."""
    named = [f"{v:,}" for v in values]
    if not named:
        return NA
    return named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]


def ratio_text(x: float | None) -> str:
    """0.44× (n/a: none)."""
    return NA if x is None else f"{x:.2f}×"


def cpu_ratio_text(ratio: Mapping[str, Any] | None) -> str:
    """A step ratio of ``steptime.json`` with its interval: 0.44× [0.43, 0.45]."""
    if not ratio:
        return NA
    return f"{ratio_text(ratio['mean'])} [{ratio['ci_low']:.2f}, {ratio['ci_high']:.2f}]"


def robust_answer_text(frontier: Mapping[str, Any] | None) -> str:
    """The answer by the pre-registered rule (``frontier.json``'s ``longrange_answer``,
    ``rpka.verdict.robustness``): per length the cheapest robustly non-inferior arm and its CPU
    step ratio, and n* for RPKA and uniform landmarks; empty without it."""
    answer = (frontier or {}).get("longrange_answer")
    if not answer:
        return ""
    untimed = answer.get("untimed_lengths") or []
    parts = []
    for length, entry in answer["per_length"].items():
        if entry.get("unread"):
            parts.append(f"{int(length):,} tokens: {_words(entry['unread'])}")
            continue
        best = entry.get("cheapest")
        robust = ", ".join(f"`{a}`" for a in entry["robust_non_inferior"]) or "none"
        cost = f", cheapest `{best}` at {cpu_ratio_text(entry['step_ratio_cpu'])}" if best else ""
        parts.append(f"{int(length):,} tokens: robustly non-inferior {robust}{cost}")
    if untimed:
        stars = (f"n* not decided: no timing file (python -m rpka steptime) for "
                 f"{lengths_text(untimed)} tokens")  # fmt: skip
    else:
        pending = answer.get("pending_lengths") or []
        stars = "; ".join(
            f"n* for {method_label(m, long=True)}: {n_star_text(n, pending)}"
            for m, n in answer["n_star"].items()
        ) + (" (a tie)" if answer.get("tie") else "")  # fmt: skip
    return (f"**By the study's answer rule** ({_words(answer['rule'])}): " + "; ".join(parts)
            + f". {stars}.")  # fmt: skip


def n_star_text(n_star: int | None, pending: list[int]) -> str:
    """n* as read so far: a length, an upper bound while a shorter length is still landing,
    or not reached (at the lengths read, while some are still landing)."""
    shorter = [p for p in pending if n_star is None or p < n_star]
    if n_star is not None:
        bound = f"at most {n_star:,} tokens ({lengths_text(shorter)} tokens not read yet)"
        return bound if shorter else f"{n_star:,} tokens"
    if pending:
        return f"not reached at the lengths read; {lengths_text(pending)} tokens not read yet"
    return "not reached up to the longest length"
