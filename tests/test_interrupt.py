"""Ctrl-C: a bench interrupted between runs exits 130 with one line (no traceback), leaves
no half-written file, and the same command resumes from the runs that finished."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_an_interrupted_bench_exits_130_and_the_same_command_resumes(tmp_path):
    out = tmp_path / "bench"
    argv = [sys.executable, "-m", "rpka", "bench", "--preset", "smoke", "--out", str(out)]
    argv += ["--epochs", "12", "--no-progress"]  # runs long enough to be caught between
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # a shell's background job (CI may be one) ignores SIGINT, and a child inherits
        # that: give the command Ctrl-C as a terminal would deliver it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    while not list((out / "runs").glob("*.json")):  # the first run finished
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    err = err.decode()
    assert proc.returncode == 130, err
    assert "interrupted: the runs that finished are kept" in err and "Traceback" not in err
    assert not list(out.rglob("*.tmp"))  # nothing half-written
    assert not (out / "bench_report.json").exists()
    kept = len(list((out / "runs").glob("*.json")))

    again = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, timeout=300)
    assert again.returncode == 0, again.stderr.decode()
    timings = json.loads((out / "bench_report.json").read_text())["timings"]
    assert timings["n_runs_resumed"] == kept >= 1
