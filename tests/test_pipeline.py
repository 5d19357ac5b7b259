"""The papermill driver: parameter checks, failure reporting, HTML rendering."""

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from rpka.cli.pipeline import (
    PipelineError,
    Step,
    check_parameters,
    run_notebook,
    run_pipeline,
    stages_read,
)


def write_notebook(path, cells):
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, path)
    return path


def params_cell(source):
    cell = new_code_cell(source)
    cell.metadata["tags"] = ["parameters"]
    return cell


@pytest.fixture
def plotting_notebook(tmp_path):
    return write_notebook(
        tmp_path / "01_plot.ipynb",
        [
            params_cell("title = 'default'\nout_path = 'unused'"),
            new_markdown_cell("# A report"),
            new_code_cell(
                "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
                "import pandas as pd\nfrom IPython.display import display\n"
                "fig, ax = plt.subplots()\nax.plot([1, 2, 3])\nax.set_title(title)\nplt.show()\n"
                "display(pd.DataFrame({'verdict': ['inconclusive']}))"
            ),
        ],
    )


def test_unknown_parameter_is_rejected_before_running(plotting_notebook, tmp_path):
    with pytest.raises(PipelineError, match=r"unknown parameter\(s\) \['titel'\].*declares"):
        check_parameters(plotting_notebook, {"titel": "x"})
    out = tmp_path / "out" / "01_plot.ipynb"
    with pytest.raises(PipelineError, match="titel"):
        run_pipeline(
            [Step(plotting_notebook, out, {"titel": "x"})],
            tmp_path / "r.html",
            progress=False,
            log=lambda s: None,
        )
    assert not out.exists() and not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("parallel", [1, 2])
def test_failing_notebook_stops_the_run_naming_notebook_and_cell(
    plotting_notebook, tmp_path, parallel
):
    bad = write_notebook(
        tmp_path / "00_bad.ipynb",
        [
            params_cell("x = 1\nmarker = ''"),
            new_code_cell("y = x + 1"),
            new_code_cell(
                "import pathlib; pathlib.Path(marker).touch()\n"
                "raise RuntimeError('boom in the middle')"
            ),
        ],
    )
    # The slow one is still running when the bad one fails however loaded the machine is: it
    # waits for the bad one's last cell to start, then for longer than a failure takes to land.
    marker = tmp_path / "bad_failing"
    slow = write_notebook(
        tmp_path / "00_slow.ipynb",
        [
            new_code_cell(
                "import pathlib, time\n"
                f"while not pathlib.Path({str(marker)!r}).exists(): time.sleep(0.05)\n"
                "time.sleep(5)"
            )
        ],
    )
    # the last step is the report: side by side it starts first, and runs beside the bad one
    steps = [
        Step(bad, tmp_path / "o" / "00_bad.ipynb", {"x": 2, "marker": str(marker)}),
        Step(plotting_notebook, tmp_path / "o" / "01_plot.ipynb", {}),
        Step(plotting_notebook, tmp_path / "o" / "02_plot.ipynb", {}),
    ]
    if parallel == 2:
        steps.append(Step(slow, tmp_path / "o" / "03_slow.ipynb", {}))
    lines = []
    failure = r"00_bad.ipynb failed in cell In \[\d+\], which starts 'import pathlib.*boom in the m"
    with pytest.raises(PipelineError, match=failure):
        run_pipeline(
            steps, tmp_path / "r.html", progress=False, log=lines.append, parallel=parallel
        )
    assert any(line.endswith("] 00_bad.ipynb failed") for line in lines)
    assert not (tmp_path / "o" / "01_plot.ipynb").exists()  # no notebook started after it
    assert not (tmp_path / "o" / "02_plot.ipynb").exists()
    assert not (tmp_path / "r.html").exists()
    if parallel == 2:  # the one running beside it was waited for
        assert (tmp_path / "o" / "03_slow.ipynb").exists()
        assert any(line.startswith("[4/4] 00_slow.ipynb done") for line in lines)


# `python -m rpka report` with its notebooks replaced by one that fails in its third cell
FAILING_REPORT = """
import sys
from pathlib import Path

from rpka.cli import commands as cli
from rpka.cli import pipeline
from rpka.study import cost
from rpka.study import steps as study

bad, out = Path(sys.argv[1]), Path(sys.argv[2])
pipeline.preset_steps = lambda preset, from_results=False, publish=False: [
    pipeline.Step(bad, out, {"x": 3})
]
study.compute_steps = lambda preset, progress=True: []
cost.stored_prediction = lambda preset: None
sys.exit(cli.main(["report", "--preset", "smoke", "--html", sys.argv[3]]))
"""


def test_the_terminal_shows_one_message_for_a_failing_notebook_not_a_traceback(tmp_path):
    bad = write_notebook(
        tmp_path / "00_bad.ipynb",
        [
            params_cell("x = 1"),
            new_code_cell("y = x + 1"),
            new_code_cell("import math\nz = math.sqrt(-x)\nprint(z)"),
        ],
    )
    out = tmp_path / "out" / "00_bad.ipynb"
    script = tmp_path / "report.py"
    script.write_text(FAILING_REPORT)
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(script), str(bad), str(out), str(tmp_path / "r.html")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 1
    terminal = done.stdout + done.stderr
    assert "Traceback" not in terminal and "papermill" not in terminal.lower()
    assert done.stderr.strip().splitlines() == [
        "report failed: 00_bad.ipynb failed in cell In [4], which starts 'import math': "
        "ValueError: math domain error",
        f"executed copy with the traceback: {out}",
    ]
    assert "math domain error" in out.read_text()  # the full traceback is kept there
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("parallel", [1, 2])
def test_side_by_side_the_report_starts_first_and_the_others_in_order(tmp_path, parallel):
    """Two at a time: the report (the last notebook) starts first and overlaps the first
    of the others, which start in order; one at a time, every notebook runs in order."""
    stamp = (
        "import time, pathlib\nstart = time.time(); time.sleep(2)\n"
        "pathlib.Path(out).write_text(f'{start} {time.time()}')"
    )
    steps = []
    for i in range(4):
        cells = [params_cell("out = ''"), new_code_cell(stamp)]
        nb = write_notebook(tmp_path / f"{i}.ipynb", cells)
        steps.append(Step(nb, tmp_path / "o" / f"{i}.ipynb", {"out": str(tmp_path / f"{i}.t")}))
    lines = []
    run_pipeline(steps, tmp_path / "r.html", progress=False, log=lines.append, parallel=parallel)
    stamps = [[float(t) for t in (tmp_path / f"{i}.t").read_text().split()] for i in range(4)]
    started, ended = [s for s, _ in stamps], [e for _, e in stamps]
    starts = [line for line in lines if line.endswith(" ...")]
    if parallel == 2:
        assert started[0] < ended[3] and started[3] < ended[0]  # report and first overlap
        assert starts == [f"[{i + 1}/4] {i}.ipynb ..." for i in (3, 0, 1, 2)]
    else:
        assert all(ended[i] <= started[i + 1] for i in range(3))  # one after the other
        assert starts == [f"[{i + 1}/4] {i}.ipynb ..." for i in range(4)]
    assert (tmp_path / "r.html").exists()


@pytest.mark.parametrize("parallel", [0, -1, 1.5, True])
def test_bad_parallel_is_refused_before_running(plotting_notebook, tmp_path, parallel):
    out = tmp_path / "o" / "01_plot.ipynb"
    with pytest.raises(ValueError, match="parallel must be an integer >= 1"):
        run_pipeline([Step(plotting_notebook, out, {})], tmp_path / "r.html", parallel=parallel)
    assert not out.exists()


def test_html_is_self_contained_with_code_hidden(plotting_notebook, tmp_path):
    html_out = tmp_path / "report.html"
    lines = []
    run_pipeline(
        [Step(plotting_notebook, tmp_path / "o" / "01_plot.ipynb", {"title": "Injected title"})],
        html_out,
        progress=False,
        log=lines.append,
    )
    text = html_out.read_text()
    assert "data:image/png;base64," in text  # the figure is embedded
    assert "inconclusive" in text  # the table is there
    assert "ax.plot" not in text  # code is hidden
    assert "Executed notebooks" in text and "01_plot.ipynb" in text
    assert any("done in" in line for line in lines) and any(str(html_out) in s for s in lines)
    executed = nbformat.read(tmp_path / "o" / "01_plot.ipynb", as_version=4)
    assert any("Injected title" in c.source for c in executed.cells)


def test_wrongly_typed_parameter_is_rejected_before_running(plotting_notebook, tmp_path):
    with pytest.raises(PipelineError, match=r"parameter title must be a str like its default"):
        check_parameters(plotting_notebook, {"title": 3})
    numbers = write_notebook(tmp_path / "02_n.ipynb", [params_cell("n = 3\nscale = 0.5")])
    check_parameters(numbers, {"n": 4, "scale": 2})  # an int stands for a float
    for bad in ({"n": 4.0}, {"n": "4"}, {"n": True}, {"scale": "0.5"}):
        with pytest.raises(PipelineError, match=f"parameter {next(iter(bad))} must be a"):
            check_parameters(numbers, bad)


def test_the_kernel_does_not_warn_about_its_transport(plotting_notebook, tmp_path, capfd):
    """ipykernel warns on stderr at every start over unencrypted TCP; the report's kernels
    get Curve keys instead (issue 17 item 8: terminal noise)."""
    run_notebook(Step(plotting_notebook, tmp_path / "o.ipynb", {}), progress=False)
    assert "without encryption" not in capfd.readouterr().err


def test_the_cli_skips_jsonschemas_slow_iri_checker_and_still_validates_notebooks():
    """`python -m rpka` marks `rfc3987_syntax` absent (~2 s of Lark grammar at import);
    nbformat's validation, which the driver relies on, works without it."""
    code = textwrap.dedent(
        """
        import sys
        import rpka.__main__
        import jsonschema._format, nbformat
        from nbformat.v4 import new_code_cell, new_notebook
        assert sys.modules["rfc3987_syntax"] is None
        nbformat.validate(new_notebook(cells=[new_code_cell("x = 1")]))
        try:
            nbformat.validate(new_notebook(cells=[{"cell_type": "code"}]))
        except nbformat.ValidationError:
            print("refused")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "refused"


def test_a_notebook_waits_for_the_last_stage_that_writes_a_path_it_names(tmp_path):
    nb = write_notebook(tmp_path / "n.ipynb", [params_cell("a = ''\nb = ''\npreset = ''")])
    outputs = [
        (str(tmp_path / "runs"),),  # a folder
        (str(tmp_path / "results" / "bench.json"),),
        (str(tmp_path / "results" / "index.json"), str(tmp_path / "scaling.json")),
    ]
    compute = [(f"stage {i}", lambda: None, out) for i, out in enumerate(outputs)]

    def reads(**parameters):
        return stages_read(Step(nb, tmp_path / "o.ipynb", parameters), compute)

    assert reads(a=str(tmp_path / "results" / "bench.json"), preset="smoke") == 2
    assert reads(a=str(tmp_path / "runs" / "one.json")) == 1  # a file in a folder it writes
    assert reads(a=str(tmp_path / "results")) == 3  # a folder above what the last writes
    assert reads(a=str(tmp_path / "elsewhere.json"), b="smoke") == 0


@pytest.mark.parametrize(("parallel", "overlap"), [(2, True), (2, False), (1, True)])
def test_with_overlap_a_notebook_runs_beside_the_stages_it_does_not_read(
    tmp_path, parallel, overlap
):
    overlapped = overlap and parallel > 1
    first_out, second_out = tmp_path / "first.json", tmp_path / "second.json"
    started = tmp_path / "early_started"
    early = write_notebook(
        tmp_path / "early.ipynb",
        [
            params_cell("data = ''\nmarker = ''"),
            new_code_cell(
                "import pathlib\nassert pathlib.Path(data).exists()\npathlib.Path(marker).touch()"
            ),
        ],
    )
    last = write_notebook(
        tmp_path / "report.ipynb",
        [
            params_cell("data = ''"),
            new_code_cell("import pathlib; assert pathlib.Path(data).exists()"),
        ],
    )

    def second():  # side by side, the early notebook runs meanwhile: wait for its marker
        deadline = time.monotonic() + 120
        while overlapped and not started.exists():
            assert time.monotonic() < deadline, "the early notebook did not start beside me"
            time.sleep(0.05)
        second_out.write_text("2")

    compute = [
        ("first", lambda: first_out.write_text("1"), (str(first_out),)),
        ("second", second, (str(second_out),)),
    ]
    steps = [
        Step(
            early, tmp_path / "o" / "early.ipynb", {"data": str(first_out), "marker": str(started)}
        ),
        Step(last, tmp_path / "o" / "report.ipynb", {"data": str(second_out)}),
    ]
    lines = []
    run_pipeline(
        steps, tmp_path / "r.html", progress=False, log=lines.append, compute=compute,
        parallel=parallel, overlap=overlap,
    )
    position = {line.split(" in ")[0]: i for i, line in enumerate(lines)}
    assert position["[compute 2/2] second done"] < position["[2/2] report.ipynb ..."]
    if not overlapped:  # every stage first, then the notebooks
        assert position["[compute 2/2] second done"] < position["[1/2] early.ipynb ..."]
    assert (tmp_path / "r.html").exists()


def test_a_failing_notebook_stops_the_stages_and_a_failing_stage_the_notebooks(tmp_path):
    out = tmp_path / "first.json"
    bad = write_notebook(
        tmp_path / "bad.ipynb", [params_cell("data = ''"), new_code_cell("raise ValueError('nb')")]
    )
    report_nb = write_notebook(tmp_path / "report.ipynb", [params_cell("data = ''")])
    steps = [
        Step(bad, tmp_path / "o" / "bad.ipynb", {"data": str(out)}),
        Step(report_nb, tmp_path / "o" / "report.ipynb", {"data": str(tmp_path)}),
    ]
    lines, ran = [], []

    def wait_for_the_failure():
        deadline = time.monotonic() + 120
        while not any(line.endswith("bad.ipynb failed") for line in lines):
            assert time.monotonic() < deadline
            time.sleep(0.05)

    compute = [
        ("first", lambda: out.write_text("1"), (str(out),)),
        ("second", wait_for_the_failure, ()),
        ("third", lambda: ran.append("third"), (str(tmp_path / "x.json"),)),
    ]
    with pytest.raises(PipelineError, match="bad.ipynb failed in cell"):
        run_pipeline(
            steps, tmp_path / "r.html", progress=False, log=lines.append, compute=compute,
            overlap=True,
        )
    assert not ran and not (tmp_path / "o" / "report.ipynb").exists()

    def broken():
        raise RuntimeError("a stage broke")

    compute = [("first", broken, (str(out),))]
    with pytest.raises(RuntimeError, match="a stage broke"):
        run_pipeline(
            steps, tmp_path / "r2.html", progress=False, log=lines.append, compute=compute,
            overlap=True,
        )
    assert not (tmp_path / "r2.html").exists()


def test_a_log_that_breaks_stops_the_run_instead_of_hanging_it(plotting_notebook, tmp_path):
    """A log that raises in a notebook's completion (a closed stdout: `report | head`)
    must end the run with that error, not leave the pipeline waiting for ever."""

    def log(line):
        if " done in " in line:
            raise BrokenPipeError("stdout closed")

    steps = [Step(plotting_notebook, tmp_path / "o" / f"{i}.ipynb", {}) for i in range(3)]
    outcome = []

    def run():
        try:
            run_pipeline(steps, tmp_path / "r.html", progress=False, log=log)
        except BaseException as err:  # noqa: BLE001 - the outcome is what is checked
            outcome.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=180)
    assert not thread.is_alive(), "the pipeline hung"
    assert outcome and isinstance(outcome[0], BrokenPipeError)
    assert not (tmp_path / "r.html").exists()


def test_side_by_side_one_bar_over_the_notebooks_and_the_files_written_named(tmp_path, capsys):
    """Issue 43, first-hour polish: side by side the notebooks showed no bar (their cell
    bars are off: they would interleave) - now one bar over them; and the report named the
    file it wrote but not its preset's copy, nor that it replaced another preset's report
    (`--from-results --preset full` overwrote reports/rpka_report.html unannounced)."""
    steps = []
    for i in range(2):
        nb = write_notebook(tmp_path / f"{i}.ipynb", [new_code_cell(f"print({i})")])
        steps.append(Step(nb, tmp_path / "o" / f"{i}.ipynb", {}))
    html_out = tmp_path / "rpka_report.html"
    before = "RPKA study report (standard preset, commit abc1234)"
    html_out.write_text(f"<html><head><title>{before}</title></head><body></body></html>")
    lines = []
    title = "RPKA study report (full preset, commit def5678)"
    run_pipeline(steps, html_out, progress=True, log=lines.append, parallel=2, title=title)
    bars = [line for line in capsys.readouterr().err.split("\r") if "notebooks" in line]
    assert bars and "2/2" in bars[-1], bars
    assert len(bars) <= 4, bars  # in a log (not a terminal): drawn as notebooks end only
    written = next(line for line in lines if line.startswith("report: "))
    copy = tmp_path / "o" / "rpka_report.html"
    assert written.startswith(f"report: {html_out} (and its preset's copy {copy}); ")
    assert f"it replaces the report that was there: {before} (total " in written
    assert copy.exists() and title in html_out.read_text()
    lines.clear()
    run_pipeline(steps, html_out, progress=False, log=lines.append, parallel=2, title=title)
    assert "replaces" not in next(line for line in lines if line.startswith("report: "))
