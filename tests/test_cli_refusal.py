"""Bad values and output paths are refused before any compute: exit 2, one line naming the
parameter (issue 17 item 1)."""

import os

import pytest

from rpka import paths
from rpka.cli import commands as cli
from rpka.cli import pipeline


@pytest.mark.parametrize(
    ("main", "argv", "message"),
    [
        (cli.parse_bench, ["--seeds", "1"], "argument --seeds: must be in [2, 1000], got 1"),
        (
            cli.parse_bench,
            ["--seeds", "99999999999999999999"],
            "argument --seeds: must be in [2, 1000]",
        ),
        (
            cli.parse_bench,
            ["--scheduler", "localhost"],
            "argument --scheduler: expected tcp://host:port",
        ),
        (cli.cost_main, ["--steps", "0"], "argument --steps: must be in [1, 1000], got 0"),
        (cli.cost_main, ["--benches", "nope"], "argument --benches: unknown ['nope']"),
    ],
)
def test_bad_values_exit_2_naming_the_parameter(main, argv, message, capsys, no_compute):
    with pytest.raises(SystemExit) as exit_info:
        main(["--preset", "smoke", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_an_output_path_that_is_a_file_is_refused(tmp_path, capsys):
    a_file = tmp_path / "results"
    a_file.write_text("")
    with pytest.raises(SystemExit) as exit_info:
        cli.parse_bench(["--preset", "smoke", "--out", str(a_file)])
    assert exit_info.value.code == 2
    assert "argument --out:" in (err := capsys.readouterr().err) and "is a file" in err


def test_an_unwritable_output_folder_is_refused(tmp_path, capsys):
    parent = tmp_path / "a_file"
    parent.write_text("")  # a folder below a file can never be created, root or not
    with pytest.raises(SystemExit) as exit_info:
        cli.parse_bench(["--preset", "smoke", "--out", str(parent / "results")])
    assert exit_info.value.code == 2
    assert "argument --out: cannot write to" in capsys.readouterr().err


def test_a_good_command_line_parses_and_probes_its_folder(tmp_path):
    out = tmp_path / "new" / "results"
    config, args = cli.parse_bench(["--preset", "smoke", "--out", str(out), "--seeds", "3"])
    assert len(config.design.eval_seeds) == 3 and args.out == out and out.is_dir()
    assert list(out.iterdir()) == []  # the probe leaves nothing behind


def _never(*args, **kwargs):
    raise AssertionError("the compute ran before the output path was checked")


@pytest.fixture
def no_compute(monkeypatch):
    """Any compute of report, scaling, decode or cost fails the test: refusal must come first."""
    monkeypatch.setattr(pipeline, "run_pipeline", _never)
    monkeypatch.setattr(cli.scaling, "run_scaling", _never)
    monkeypatch.setattr(cli.decoding, "run_decoding", _never)
    monkeypatch.setattr(cli.cost, "run_cost_model", _never)


OUTPUT_FILE_COMMANDS = [
    (cli.report_main, ["--preset", "smoke"], "--html"),
    (cli.scaling_main, ["--preset", "tiny"], "--out"),
    (cli.decode_main, [], "--out"),
    (cli.cost_main, ["--preset", "smoke"], "--out"),
]


@pytest.mark.parametrize(("main", "argv", "flag"), OUTPUT_FILE_COMMANDS)
def test_an_output_file_that_is_a_folder_is_refused(main, argv, flag, tmp_path, capsys, no_compute):
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, flag, str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith(f"argument {flag}: {tmp_path} is a folder, not a file")


@pytest.mark.parametrize(("main", "argv", "flag"), OUTPUT_FILE_COMMANDS)
def test_an_output_file_below_a_file_is_refused(main, argv, flag, tmp_path, capsys, no_compute):
    a_file = tmp_path / "file"
    a_file.write_text("")  # file/x.json can never be created, root or not
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, flag, str(a_file / "x.json")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith(f"argument {flag}: {a_file} is a file, not a folder")
    assert a_file.read_text() == ""


@pytest.mark.parametrize(("main", "argv", "flag"), OUTPUT_FILE_COMMANDS)
def test_an_unwritable_output_folder_is_refused_for_files(
    main, argv, flag, tmp_path, capsys, no_compute, monkeypatch
):
    def refuse(self, *args, **kwargs):  # a read-only folder, also when the tests run as root
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cli.Path, "write_text", refuse)
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, flag, str(tmp_path / "x.json")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith(f"argument {flag}: cannot write to {tmp_path} (Permission denied)")


def test_longctx_refuses_an_output_folder_that_is_a_file(tmp_path, capsys):
    a_file = tmp_path / "results"
    a_file.write_text("")
    with pytest.raises(SystemExit) as exit_info:
        cli.parse_longctx(["--preset", "smoke", "--out", str(a_file)])
    assert exit_info.value.code == 2
    assert f"argument --out: {a_file} is a file, not a folder" in capsys.readouterr().err


def test_summary_refuses_a_missing_readme(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli.readme, "render", _never)
    with pytest.raises(SystemExit) as exit_info:
        cli.summary_main(["--readme", str(tmp_path / "README.md")])
    assert exit_info.value.code == 2
    assert "argument --readme:" in capsys.readouterr().err


@pytest.mark.parametrize("seeds", ["1", "99999999999999999999"])
def test_longctx_refuses_seeds_out_of_range_like_bench(seeds, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.parse_longctx(["--preset", "smoke", "--seeds", seeds])
    assert exit_info.value.code == 2
    assert "argument --seeds: must be in [2, 1000]" in capsys.readouterr().err


@pytest.mark.parametrize("content", ["", "{not json", "[1, 2]"])
def test_a_garbage_result_file_is_named_by_every_reader(tmp_path, content):
    """summary, the report page and its study index read result files the user may have
    edited or truncated: the error names the file (issue 17 item 2)."""
    from rpka import report
    from rpka.io import CorruptFileError
    from rpka.report import readme

    bad = tmp_path / "bench_report.json"
    bad.write_text(content)
    # valid JSON of the wrong shape: only the study index checks what a bench report holds
    readers = [readme._load, report.optional_json] if content != "[1, 2]" else []
    (tmp_path / "study.json").write_text('{"tracks": {"x": {"bench_report": "bench_report.json"}}}')
    for read in [*readers, lambda _: report.load_study(tmp_path / "study.json", "full")]:
        with pytest.raises(CorruptFileError, match=str(bad)):
            read(bad)


def test_a_corrupt_file_error_exits_2_with_one_line(monkeypatch, capsys):
    from rpka.io import CorruptFileError

    message = "data/results/full/study.json: not valid JSON (line 1)"

    def corrupt(_argv):
        raise CorruptFileError(message)

    monkeypatch.setitem(cli.COMMANDS, "summary", (corrupt, "test"))
    assert cli.main(["summary"]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


@pytest.mark.parametrize("value", ["0", "-2"])
def test_report_refuses_a_parallel_below_one(value, tmp_path, capsys, no_compute):
    with pytest.raises(SystemExit) as exit_info:
        html = str(tmp_path / "r.html")
        cli.report_main(["--preset", "smoke", "--parallel", value, "--html", html])
    assert exit_info.value.code == 2
    assert f"--parallel must be an integer >= 1, got {value}" in capsys.readouterr().err


def test_from_results_is_refused_when_a_result_is_missing(tmp_path, monkeypatch, capsys):
    """--from-results computes nothing: a missing result is named up front (a notebook
    used to compute it, e.g. the full demo's 210 s of training)."""
    missing = ["data/results/smoke/bench_report.json", "a", "b", "c"]
    monkeypatch.setattr(cli.study, "missing_results", lambda preset: missing)
    monkeypatch.setattr(pipeline, "run_pipeline", _never)
    with pytest.raises(SystemExit) as exit_info:
        cli.report_main(["--preset", "smoke", "--from-results", "--html", str(tmp_path / "r.html")])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert "--from-results: 4 result file(s) of preset smoke missing" in error
    assert "data/results/smoke/bench_report.json, a, b, ...)" in error


def test_from_results_trains_nothing_and_draws_into_the_report_folder(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(cli.study, "missing_results", lambda preset: [])
    monkeypatch.setattr(cli.study, "render_steps", lambda preset: [])
    monkeypatch.setattr(cli.study, "compute_steps", _never)
    monkeypatch.setattr(
        pipeline, "run_pipeline", lambda steps, *a, **kw: seen.update(kw, steps=steps)
    )
    cli.report_main(["--preset", "smoke", "--from-results", "--html", str(tmp_path / "r.html")])
    assert seen["compute"] == [] and seen["parallel"] == 2
    for step in seen["steps"]:
        assert step.parameters["compute_missing"] is False
        assert step.parameters["figures_dir"] == "out/smoke/figures"  # a user's run folder
    assert not os.environ.get(paths.OUTPUT_ENV)  # the layout ends with the command


def test_bench_requires_a_preset_naming_them(monkeypatch, capsys):
    """Without --preset the bench ran the full study (hours) into the committed results."""
    monkeypatch.setattr(cli.bench, "run_bench", _never)
    with pytest.raises(SystemExit) as exit_info:
        cli.bench_main([])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert (
        "argument --preset is required: one of frontier, full, gate, pairs-16, pairs-24, "
        "pairs-4, quick, quick-study, smoke, smoke-study, standard"
    ) in error


@pytest.mark.parametrize("track", ["forecast", "lm"])
def test_the_committed_study_is_written_only_when_named(track, monkeypatch, capsys):
    """The full preset's default folder is the committed ``data/results/full`` (and its
    track folders): refused as a default, accepted when ``--out`` names it."""
    monkeypatch.setattr(cli.bench, "run_bench", _never)
    argv = ["--preset", "full", "--track", track]
    with pytest.raises(SystemExit) as exit_info:
        cli.bench_main(argv)
    assert exit_info.value.code == 2
    folder = "data/results/full" + ("/lm" if track == "lm" else "")
    assert f"default folder {folder} holds the committed study" in capsys.readouterr().err
    _, args = cli.parse_bench([*argv, "--out", folder])  # named: asked in so many words
    assert args.out == cli.resolve(folder)


def test_bench_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        cli.bench_main(["--help"])
    help_ = " ".join(capsys.readouterr().out.split())
    assert "the study to run (required;" in help_
    assert "(default: forecast)" in help_ and "(default: local)" in help_
    assert "(default: data/results/<preset>," in help_


@pytest.mark.parametrize(
    ("main", "argv", "flag"),
    [
        *OUTPUT_FILE_COMMANDS,
        (cli.parse_bench, ["--preset", "smoke"], "--out"),
        (cli.longctx_main, ["--preset", "smoke"], "--out"),
    ],
)
def test_an_empty_output_path_is_refused_not_the_default(main, argv, flag, capsys, no_compute):
    """`decode --out ''` fell back to the default and overwrote the committed
    data/results/scaling/decode_cpu.json with a toy run."""
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, flag, ""])
    assert exit_info.value.code == 2
    assert f"argument {flag}: an empty path" in capsys.readouterr().err
