"""A newcomer's first command leaves the clone as it found it (issue 43, item 1): the
committed results are in the schema the code writes, and nothing a report renders from
them is tracked."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rpka.paths import REPO_ROOT


def _git(*args: str, cwd: os.PathLike) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True
    ).stdout


@pytest.mark.slow
def test_a_report_from_the_committed_results_leaves_a_clone_clean(tmp_path):
    if not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    clone = tmp_path / "clone"
    _git("clone", "--quiet", str(REPO_ROOT), str(clone), cwd=tmp_path)
    # the clone's own package, in this process and in the notebook kernels it starts
    env = {**os.environ, "PYTHONPATH": str(clone)}
    done = subprocess.run(
        [sys.executable, "-m", "rpka", "report", "--preset", "standard", "--from-results",
         "--no-progress"],
        cwd=clone, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert _git("status", "--porcelain", cwd=clone) == ""
