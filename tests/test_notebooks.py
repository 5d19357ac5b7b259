"""The notebooks as committed, and the HTML report of the smoke preset.

nbval executes every notebook with its smoke defaults (``--nbval-lax``, see pyproject.toml);
these tests check what nbval does not: the committed form and the rendered report.
"""

import ast
import base64
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

import rpka
from rpka import paths
from rpka.cli.pipeline import (
    Step,
    declared_parameters,
    preset_steps,
    preset_title,
    run_notebook,
    run_pipeline,
)
from rpka.paths import REPO_ROOT
from rpka.report import provenance
from rpka.study.notebook_params import check
from rpka.study.steps import NOTEBOOKS, load_result, notebook_parameters

NOTEBOOK_DIR = REPO_ROOT / "notebooks"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_without_outputs_with_one_parameters_cell(name):
    nb = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    # the project kernel `make setup` installs (Lab offers it by name); tests and the
    # pipeline run the notebooks on the interpreter that runs them (python3)
    assert nb.metadata["kernelspec"]["name"] == "rpka"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "outputs committed"
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and tagged[0] is code[0], "one parameters cell, the first code cell"
    # literals only: every line is a comment or `name = <literal>`
    for line in tagged[0].source.splitlines():
        assert line.startswith("#") or re.fullmatch(r"\w+ = .+", line), line


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_defaults_are_the_smoke_parameters(name):
    """The parameters cell names the smoke preset and leaves every path None: the first
    cell derives them (rpka.study.notebook_params), the same as the pipeline passes."""
    declared = {k: v["default"] for k, v in declared_parameters(NOTEBOOK_DIR / name).items()}
    assert declared["preset"] == "'smoke'"
    defaults = {k: ast.literal_eval(v) for k, v in declared.items()}
    settled = check(name, defaults)
    for key, value in notebook_parameters("smoke")[name].items():
        assert settled[key] == value, key


def test_every_preset_passes_only_declared_parameters():
    for preset in ("smoke", "quick", "full"):
        for step in preset_steps(preset):
            assert set(step.parameters) <= set(declared_parameters(step.notebook))


@pytest.fixture(scope="module")
def smoke_report(tmp_path_factory):
    """The smoke study run as `report --preset smoke` runs it (notebooks beside the
    stages): the folder of the executed notebooks and the HTML, and the run's log."""
    out = tmp_path_factory.mktemp("report")
    steps = preset_steps("smoke")
    for step in steps:  # executed copies go to the temporary folder
        step.output = out / step.notebook.name
    from rpka.study.steps import compute_steps

    lines = []
    run_pipeline(
        steps,
        out / "rpka_report.html",
        progress=False,
        log=lines.append,
        compute=compute_steps("smoke", progress=False),
        title=preset_title("smoke"),
        overlap=True,
    )
    return out, lines


@pytest.fixture(scope="module")
def smoke_html(smoke_report):
    return (smoke_report[0] / "rpka_report.html").read_text()


# what each notebook reads, by the study's design (docs/design.md section 6), written out
# here independently of the parameters and stage outputs the pipeline derives it from
READS = {
    "01_train.ipynb": "demo training (01_train)",  # its two demo models
    "02_sweep.ipynb": "study index",  # the results folder
    "03_deltas.ipynb": "bench",  # the primary track's bench report
    "04_mechanism.ipynb": "bench (forecast-motif)",  # the motif bench's mechanism check
    "05_scaling.ipynb": "long-context training",  # the scaling sweep, then long context
    "07_your_model.ipynb": "swap audit (07_your_model)",  # rpka.swap's audit of its model
    "06_report.ipynb": "study index",  # everything
}


def test_each_notebook_starts_after_the_stage_that_writes_what_it_reads(smoke_report):
    _, lines = smoke_report
    # "[compute 2/9] bench done in 1.6 s" -> "bench done"; "[3/6] 03_deltas.ipynb ..." -> ...
    at = {
        line.split(" in ")[0].split("] ", 1)[1]: i for i, line in enumerate(lines) if "] " in line
    }
    assert set(READS) == set(NOTEBOOKS)
    for name, stage in READS.items():
        assert at[f"{stage} done"] < at[f"{name} ..."], name
    assert at["01_train.ipynb ..."] < at["study index ..."]  # and some ran beside the stages


def test_smoke_html_embeds_its_images(smoke_html):
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', smoke_html)
    assert len(images) >= 3
    assert all(base64.b64decode(img)[:8] == b"\x89PNG\r\n\x1a\n" for img in images)
    assert not re.search(r'<img[^>]+src="(?!data:)', smoke_html), "an image is not embedded"


def test_smoke_html_has_the_verdict_table_and_no_code(smoke_html):
    assert "<table" in smoke_html and "verdict" in smoke_html
    assert re.search(r"significant (win|loss)|inconclusive", smoke_html)
    assert "read_json(" not in smoke_html  # code cells hidden
    assert "Traceback" not in smoke_html and "Warning" not in smoke_html


@pytest.mark.slow
def test_a_notebook_opened_in_a_fresh_clone_computes_what_it_reads(tmp_path, monkeypatch):
    """Nothing run yet (an empty root): 03_deltas computes the smoke bench it reads, with
    one line saying so, instead of failing on a missing file (issue 17 item 6)."""
    monkeypatch.setenv("RPKA_ROOT", str(tmp_path))  # the kernel's rpka.paths root
    executed = tmp_path / "executed.ipynb"
    run_notebook(Step(NOTEBOOK_DIR / "03_deltas.ipynb", executed, {}), progress=False)
    assert (tmp_path / "data/results/smoke/bench_report.json").exists()
    outputs = [o for c in nbformat.read(executed, as_version=4).cells for o in c.get("outputs", [])]
    said = [o["text"] for o in outputs if o.get("name") == "stdout"]
    assert any("is not there yet: computing it now (bench, preset smoke)" in t for t in said)


@pytest.mark.slow
def test_the_report_opened_in_a_fresh_clone_computes_its_benches(tmp_path, monkeypatch):
    """06_report with nothing run yet computes the study's smoke benches it reads."""
    monkeypatch.setenv("RPKA_ROOT", str(tmp_path))
    executed = tmp_path / "executed.ipynb"
    run_notebook(Step(NOTEBOOK_DIR / "06_report.ipynb", executed, {}), progress=False)
    assert (tmp_path / "data/results/smoke/bench_report.json").exists()


def test_a_result_no_study_step_writes_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nowhere\.json does not exist and no step"):
        load_result(tmp_path / "nowhere.json", "smoke")


def test_smoke_html_has_a_title_the_commit_and_loads_nothing_from_the_network(smoke_html):
    commit = provenance()["commit"]
    assert f"<title>RPKA preview report (smoke preset, commit {commit})</title>" in smoke_html
    assert f"<code>{commit}</code>" in smoke_html
    assert "<script" not in smoke_html  # nbconvert's require.js / MathJax / mermaid loaders
    assert not re.search(r"<(link|img|iframe)[^>]+(href|src)=[\"']https?:", smoke_html)
    assert not re.search(r"<a [^>]*href=\"(?!#|https?:)", smoke_html), "a link to a local file"


def test_smoke_html_gives_every_image_alt_text_and_a_numbered_caption(smoke_html):
    images = re.findall(r"<img[^>]*>", smoke_html)
    assert images and all(re.search(r'alt="[^"]{20,}"', img) for img in images), images
    captions = re.findall(r"<figcaption><b>Figure (\d+)\.</b>", smoke_html)
    assert [int(n) for n in captions] == list(range(1, len(images) + 1))


def test_smoke_html_says_it_is_a_preview_and_starts_with_the_summary(smoke_html):
    assert "Preview, not a result." in smoke_html and "draw no conclusions" in smoke_html
    headings = re.findall(r"<h2[^>]*>(.*?)<", smoke_html)
    assert headings[0] == "Summary" and headings[-1] == "Appendix"


@pytest.mark.slow
def test_from_results_trains_nothing_and_leaves_a_clone_unchanged(smoke_report, tmp_path):
    """A clone of a study as git keeps it (result and run files, figures; no weights, data
    cache or reports): `report --from-results` trains nothing, and `git status` stays
    clean - figures and notebooks go to out/<preset>/ (issue 31 item 5; issue 56)."""
    root = tmp_path / "clone"
    skip = shutil.ignore_patterns("*.pt", "*.corrupt-*", "*.tmp")
    for part in ("notebooks", "data/results/smoke", "figures/smoke"):
        shutil.copytree(REPO_ROOT / part, root / part, ignore=skip)
    (root / ".gitignore").write_text(f"reports/\n/{paths.OUT}/\ndata/cache/\n")

    def git(*args):
        done = subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True)
        return done.stdout

    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "the study")
    source = Path(rpka.__file__).resolve().parent.parent  # the kernels import this rpka
    env = {**os.environ, "RPKA_ROOT": str(root), "PYTHONPATH": str(source)}
    command = [sys.executable, "-m", "rpka", "report", "--preset", "smoke", "--from-results"]
    done = subprocess.run(
        [*command, "--no-progress", "--html", str(root / "reports/r.html")],
        cwd=root, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[compute" not in done.stdout + done.stderr  # no stage: nothing trained
    assert git("status", "--porcelain", "--untracked-files=all") == ""
    assert (root / paths.OUT / "smoke/figures/train_curves.png").exists()
    executed = nbformat.read(root / paths.OUT / "smoke/01_train.ipynb", as_version=4)
    said = [o.get("text", "") for c in executed.cells for o in c.get("outputs", [])]
    assert any("weights are not here: no forecasts drawn" in text for text in said)
