"""Bad values and output paths are refused before any compute: exit 2, one line naming the
parameter (issue 17 item 1)."""

import pytest

from rpka import cli


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--seeds", "1"], "argument --seeds: must be in [2, 1000], got 1"),
        (["--seeds", "99999999999999999999"], "argument --seeds: must be in [2, 1000]"),
        (["--scheduler", "localhost"], "argument --scheduler: expected tcp://host:port"),
    ],
)
def test_bad_values_exit_2_naming_the_parameter(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.parse_bench(["--preset", "smoke", *argv])
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
    assert len(config.eval_seeds) == 3 and args.out == out and out.is_dir()
    assert list(out.iterdir()) == []  # the probe leaves nothing behind
