"""The notebooks' parameters (rpka.study.notebook_params): paths derived from the preset unless
passed, and a mistyped name or value stopped at once with one line (issue 31 item 4)."""

import nbformat
import papermill
import pytest

from rpka.cli.pipeline import PipelineError, check_parameters, declared_parameters
from rpka.paths import REPO_ROOT
from rpka.study.notebook_params import (
    FLAGS,
    NUMBERS,
    RANK_LISTS,
    ParameterError,
    assigned_literals,
    check,
    declared,
    settle,
)
from rpka.study.steps import NOTEBOOKS, notebook_parameters

NOTEBOOK_DIR = REPO_ROOT / "notebooks"
T = "01_train.ipynb"


@pytest.mark.parametrize("name", NOTEBOOKS)
@pytest.mark.parametrize("preset", ["smoke", "quick", "full"])
def test_every_path_follows_the_preset_unless_passed(name, preset):
    settled = check(name, {"preset": preset})
    expected = notebook_parameters(preset)[name]
    assert {k: settled[k] for k in expected} == expected
    path = next(k for k in expected if k != "preset")
    assert check(name, {"preset": preset, path: "elsewhere/x.json"})[path] == "elsewhere/x.json"


def test_quick_writes_the_quick_study_not_the_smoke_defaults():
    settled = check("01_train.ipynb", {"preset": "quick"})
    assert settled["run_dir"] == "data/results/quick/train"
    assert settled["figures_dir"] == "figures/quick"
    assert settled["n_windows_shown"] == 3


@pytest.mark.parametrize(
    ("notebook", "given", "message"),
    [
        (T, {"presett": "quick"}, r"unknown parameter 'presett' \(did you mean preset"),
        (T, {"preset": "quik"}, r"standard, full, got 'quik' \(did you mean quick"),
        (T, {"preset": 3}, r"preset must be one of smoke, quick, standard, full, got 3"),
        ("03_deltas.ipynb", {"bench_report": 42}, r"bench_report must be a path .* got 42"),
        (T, {"figures_dir": [1, 2]}, r"figures_dir must be a path .* got \[1"),
        (T, {"n_windows_shown": "three"}, r"n_windows_shown .* in \[1, 20\], got 'three'"),
        (T, {"n_windows_shown": 0}, r"n_windows_shown .* in \[1, 20\], got 0"),
        (T, {"n_windows_shown": True}, r"n_windows_shown must be an integer"),
        ("02_sweep.ipynb", {"results_dir": {"a": 1}}, r"parameter results_dir must be a path"),
        ("02_sweep.ipynb", {"results_dir": "  "}, r"parameter results_dir must be a path"),
        ("07_nothing.ipynb", {}, r"notebook '07_nothing.ipynb': not one of 01_train"),
        ("05_scaling.ipynb", {"compute_missing": "no"}, r"compute_missing must be True or"),
    ],
)  # fmt: skip
def test_a_wrong_parameter_is_one_line_naming_it(notebook, given, message):
    with pytest.raises(ParameterError, match=message) as err:
        check(notebook, given)
    assert "\n" not in str(err.value)
    assert err.value._render_traceback_() == [f"ParameterError: {err.value}"]  # IPython's


def test_the_pipeline_refuses_the_same_before_starting_a_kernel():
    with pytest.raises(PipelineError, match="preset must be one of"):
        check_parameters(NOTEBOOK_DIR / "01_train.ipynb", {"preset": "quik"})
    with pytest.raises(PipelineError, match="unknown parameter"):
        check_parameters(NOTEBOOK_DIR / "01_train.ipynb", {"presett": "quick"})


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_notebook_declares_what_the_check_knows_and_settles_first(name):
    """The parameters cell: the preset, every path None, the numbers' defaults; the first
    cell after it calls settle with the notebook's own name."""
    defaults = {k: v["default"] for k, v in declared_parameters(NOTEBOOK_DIR / name).items()}
    assert list(defaults) == declared(name)
    for key, default in defaults.items():
        if key == "preset":
            assert default == "'smoke'"
        elif key in NUMBERS.get(name, {}):
            assert default == repr(NUMBERS[name][key][0])
        elif key in FLAGS:
            assert default == repr(FLAGS[key][0])
        elif key in RANK_LISTS.get(name, {}):
            assert default == repr(RANK_LISTS[name][key])
        else:
            assert default == "None", key
    nb = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert f'settle("{name}", globals())' in code[1].source


def test_only_literal_assignment_cells_are_parameters():
    cells = [
        "# Parameters\npreset = 'smoke'\nrun_dir = None",
        '# Parameters\npresett = "quick"\n',
        "import pandas as pd\nruns = dict(a=1)",
        "x = compute()",
        "not python (",
    ]
    assert assigned_literals(cells) == {"preset": "smoke", "run_dir": None, "presett": "quick"}


def test_settle_reads_the_injected_cell_and_fills_the_namespace():
    namespace = {
        "In": ["", "preset = 'smoke'\nrun_dir = None", 'preset = "quick"', "settle(...)"],
        "preset": "quick",
        "run_dir": None,
        "figures_dir": None,
        "n_windows_shown": 3,
    }
    settle("01_train.ipynb", namespace)
    assert namespace["run_dir"] == "data/results/quick/train"
    namespace["In"].insert(3, "presett = 'full'")
    namespace["presett"] = "full"
    with pytest.raises(ParameterError, match="unknown parameter 'presett'"):
        settle("01_train.ipynb", namespace)


def test_papermill_with_a_mistyped_parameter_stops_in_the_first_cell_with_one_line(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("RPKA_ROOT", str(tmp_path))  # the kernel's root: nothing written here
    executed = tmp_path / "executed.ipynb"
    with pytest.raises(papermill.PapermillExecutionError) as err:
        papermill.execute_notebook(
            str(NOTEBOOK_DIR / "03_deltas.ipynb"),
            str(executed),
            parameters={"presett": "quick"},
            kernel_name="python3",
            progress_bar=False,
            cwd=str(REPO_ROOT),
        )
    assert err.value.ename == "ParameterError"
    assert "unknown parameter 'presett' (did you mean preset?)" in err.value.evalue
    errors = [
        o
        for c in nbformat.read(executed, as_version=4).cells
        for o in c.get("outputs", [])
        if o["output_type"] == "error"
    ]
    assert len(errors) == 1 and len(errors[0]["traceback"]) == 1  # no traceback
    assert not (tmp_path / "data").exists()  # stopped before any work


def test_02_says_it_computes_a_missing_bench(tmp_path, monkeypatch, capsys):
    """02_sweep on a fresh state computed the bench without the line the README promises."""
    from rpka.study import steps as study

    monkeypatch.setattr(study.bench, "run_bench", lambda *a, **kw: {"ran": True})
    assert study.load_or_run_bench("smoke", tmp_path) == {"ran": True}
    out = capsys.readouterr().out
    assert f"{tmp_path}/bench_report.json is not there yet: computing it now (bench" in out
    monkeypatch.setattr(study.bench, "run_bench", _never)
    with pytest.raises(study.NotComputed):
        study.load_or_run_bench("smoke", tmp_path, compute=False)


def _never(*args, **kwargs):
    raise AssertionError("computed")
