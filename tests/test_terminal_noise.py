"""What a study run prints to the terminal besides its progress: nothing harmless
(issue 17 item 8: nested bars' "[A" escapes in logs, kineto's USDT lines)."""

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from rpka.config.presets import get_preset
from rpka.io import has_checksum
from rpka.training.run_config import make_run_config
from rpka.training.train import train_run

ROOT = Path(__file__).resolve().parent.parent
SMOKE = get_preset("smoke", train={"epochs": 1})


def _train(tmp_path, progress, split="val"):
    rc = make_run_config(SMOKE, SMOKE.arm("exact"), 3e-3, [0], split, str(tmp_path), progress)
    train_run(rc)


def test_a_nested_bar_is_not_drawn_into_a_log(tmp_path, capsys):
    # under capsys stderr is not a terminal, like `make report 2> log` or a notebook
    _train(tmp_path, {"enable": True, "position": 1, "leave": False})
    assert capsys.readouterr().err == ""  # no bar, no cursor escape
    _train(tmp_path, {"enable": True}, "test")  # a top-level bar (01_train's) is drawn,
    err = capsys.readouterr().err  # named by its phase: it shows validation scores as it trains
    assert "exact lr=0.003 eval" in err and "val_mse=" in err and "\x1b[A" not in err


PROFILE = textwrap.dedent(
    """
    import torch
    from rpka.speed.scaling import peak_memory_mib

    x = torch.randn(64, 64)
    print(peak_memory_mib(lambda: x @ x, "cpu") > 0)
    """
)


def test_the_memory_profiler_prints_no_trace_markers():
    """In a fresh process: kineto reads its log level once, at the first profile."""
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    run = subprocess.run(
        [sys.executable, "-c", PROFILE],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(ROOT)},
        check=True,
    )
    assert run.stdout.strip() == "True" and "USDT" not in run.stderr


FREE_DURING_PROFILE = textwrap.dedent(
    """
    {prelude}
    import torch
    from rpka.speed.scaling import peak_memory_mib

    held = [torch.zeros(256, 256)]  # allocated before the profile, freed inside it
    peak_memory_mib(lambda: held.pop(), "cpu")
    """
)


def test_the_cli_silences_c10s_unknown_memory_block_line():
    """c10 logs a line when a profiled step frees an older tensor (every long-context
    memory probe); the CLI sets c10's level before torch loads. Without it the line shows,
    so this test sees the difference."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_CPP_LOG_LEVEL"}
    env["PYTHONPATH"] = str(ROOT)

    def stderr(prelude):
        code = FREE_DURING_PROFILE.format(prelude=prelude)
        run = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
        )
        return run.stderr

    assert "Memory block of unknown size" in stderr("")
    assert "Memory block" not in stderr("import rpka.__main__")


def test_the_trace_identity_draws_one_bar_into_a_log(capsys):
    """The mechanism check ran a bar per Monte Carlo seed, each redrawn ten times a second:
    in a log (stderr not a terminal, as under capsys), many bars' lines (issue 31 item 7).
    Now one bar over every seed's steps, redrawn once a minute there."""
    import torch

    from rpka.config.bench import MechanismConfig
    from rpka.kernel.mechanism import trace_identity_study

    generator = torch.Generator().manual_seed(0)
    qkv = [tuple(torch.randn(1, 2, 12, 4, generator=generator) for _ in range(3))]
    config = MechanismConfig(rank=5, draws=50, mc_seeds=4, monte_carlo="resample")
    trace_identity_study(qkv, config, progress=True)
    err = capsys.readouterr().err
    bars = [line for line in err.replace("\r", "\n").splitlines() if "trace identity" in line]
    assert bars and all("4 Monte Carlo seeds" in line for line in bars)
    assert len(bars) <= 2, err  # the start and the end
    assert "20/20" in bars[-1]


MARK_SIGINT = """\
import signal
kernel = get_ipython().kernel
kernel.pre_handler_hook = kernel.post_handler_hook = lambda: None  # keep the handler below
signal.signal(signal.SIGINT, lambda *_: open({mark!r}, "a").write("SIGINT\\n"))
"""


def test_a_notebook_kernel_is_shut_down_without_an_interrupt(tmp_path):
    """Issue 43, finding 6: `report --from-results` printed "[IPKernelApp] ERROR |
    KeyboardInterrupt caught in kernel." in 8 of ~27 runs: jupyter_client sends SIGINT
    before every shutdown request, and a kernel still handling a message logs it. The
    kernel here records every SIGINT it gets (the race made deterministic): none comes."""
    import nbformat

    from rpka.cli import pipeline

    mark = tmp_path / "sigint.txt"
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(MARK_SIGINT.format(mark=str(mark)))]
    nbformat.write(notebook, tmp_path / "nb.ipynb")
    step = pipeline.Step(tmp_path / "nb.ipynb", tmp_path / "out.ipynb")
    pipeline.run_notebook(step, progress=False)
    assert (tmp_path / "out.ipynb").exists()
    assert not mark.exists(), mark.read_text()


def test_the_study_stages_that_take_seconds_draw_a_bar(tmp_path, capsys):
    """Issue 43, first-hour polish: a resumed `make report` retrained the demo models (their
    weights are not committed) with no bar. The demo stage draws one per model it trains
    - also where its run files are there and only the weights are missing - and the
    scaling stage one over its measurements."""
    from rpka.config.scaling import SCALING_PRESETS
    from rpka.speed import scaling
    from rpka.study import steps as study

    study.train_demo("smoke", tmp_path / "train", progress=True)
    capsys.readouterr()
    for weights in (tmp_path / "train").glob("*.pt"):
        weights.unlink()  # a clone: the run files, not their weights
    study.train_demo("smoke", tmp_path / "train", progress=True)
    err = capsys.readouterr().err
    assert "exact lr=" in err and "rpka-r4 lr=" in err and "12/12" in err
    config = dataclasses.replace(SCALING_PRESETS["tiny"], lengths=(64,), repeats=1, warmup=0)
    scaling.run_scaling(config, progress=True, out=tmp_path / "s.json", preset="tiny")
    bars = [line for line in capsys.readouterr().err.split("\r") if line.startswith("scaling")]
    assert bars and "100%" in bars[-1]
    assert has_checksum(tmp_path / "s.json")  # the scaling result is sealed (issue 43)
