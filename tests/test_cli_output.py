"""What `python -m rpka bench` prints when training fails: the word, not "nan +- nan"
(issue 17 item 4)."""

from rpka.bench import run_bench
from rpka.cli import commands as cli
from rpka.config.presets import get_preset
from rpka.training.executors import InProcessExecutor


def test_a_bench_whose_every_seed_diverged_says_so(tmp_path, capsys):
    config = get_preset(
        "smoke",
        learning_rates=(1e8,),
        train={"epochs": 1, "grad_clip": 0.0},
        mechanism=None,
        output_error_ranks=(),
    )
    report = run_bench(
        config, tmp_path / "out", InProcessExecutor(), progress=False, data_dir=tmp_path
    )
    capsys.readouterr()
    cli.print_bench_summary(report, tmp_path / "out")
    out = capsys.readouterr().out
    n = len(config.design.eval_seeds)
    for arm in report["arms"]:
        row = next(line for line in out.splitlines() if line.startswith(f"{arm} "))
        assert "n/a +- n/a" in row and row.endswith(f"{n}/{n} seeds diverged"), row
    assert "nan" not in out.split("\nExact attention")[0]  # the table, before the track's text
    assert "every evaluation seed of every arm diverged: try lower --lrs" in out
