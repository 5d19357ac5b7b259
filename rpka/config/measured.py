"""The measured times and costs every document quotes, in one place (issue 56, item 2).

The README's "Running it" table, `make help`, docs/standard.md and the report's appendix
read their numbers here or are tied to these by ``tests/test_readme.py``: a new measurement
changes this file, and the test names every document that still quotes the old one. Each
entry says what was timed, on which commit and machine, at what load.
"""

from __future__ import annotations

from dataclasses import dataclass

from rpka.config.presets import STANDARD_WALL_BUDGET_MIN


@dataclass(frozen=True)
class Measured:
    """One wall time of a command (minutes), with where and when it was measured."""

    minutes: float
    what: str
    where: str


# `make report` (the standard study) on a fresh clone: set-up, then a resume of the committed
# runs; most of it retrains the demo model, whose weights are not committed
REPORT_RESUMED = Measured(13.9, "`make report`, fresh clone, resuming the committed runs",
                          "clone of e6be3d2, 2026-12-03, load 4-5")  # fmt: skip
# every run of the standard study retrained (49.6 min of CPU)
REPORT_SCRATCH = Measured(65.6, "`make report`, every run retrained",
                          "worktree at eb41016, 2026-12-03, load 4-5")  # fmt: skip
# `make test` on a fresh clone, set-up included: CI's run (.ci/run) of main at 6ce611f
# (2,364 passed, 7 skipped), 671 s as the tracker's stop 57 reports it
MAKE_TEST = Measured(11.2, "`make test`, fresh clone, set-up included",
                     "CI's clone of 6ce611f, 2026-12-06")  # fmt: skip

BUDGET_MIN = STANDARD_WALL_BUDGET_MIN  # the standard study's budget, set-up included


def help_minutes(measured: Measured) -> str:
    """How `make help` rounds a time: "~14 min"."""
    return f"~{round(measured.minutes)} min"
