"""The README a new user reads first: at most 250 lines, licence and citation, links that
resolve, and no path that a clone does not have (issue 17 item 8, issue 43 item 2); every
command's options in docs/cli.md and every module in docs/layout.md, where they moved."""

import fnmatch
import re
import subprocess
import tomllib

import pytest

from rpka.cli import commands as cli
from rpka.paths import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()
CLI_DOC = (REPO_ROOT / "docs" / "cli.md").read_text()


def _command_line_section() -> str:
    """docs/cli.md's "## Command line" section (moved there from the README, issue 43)."""
    start = CLI_DOC.index("\n## Command line\n")
    return CLI_DOC[start : CLI_DOC.index("\n## ", start + 1)]


@pytest.mark.parametrize("command", cli.COMMANDS)
def test_the_readme_lists_every_option_of_every_command(command, capsys):
    with pytest.raises(SystemExit):
        cli.COMMANDS[command][0](["--help"])
    options = set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", capsys.readouterr().out)) - {"--help"}
    block, inside = [], False
    for line in _command_line_section().splitlines():  # its line and the indented ones after
        if line.startswith("python -m rpka "):
            inside = line.split()[3] == command
        if inside:
            block.append(line)
    # optional in brackets; a required one (bench's --preset) first, without
    listed = rf"(\[|^python -m rpka {command}\s+)"
    missing = sorted(o for o in options if not re.search(listed + rf"{o}\b", "\n".join(block)))
    assert block and not missing, f"docs/cli.md's `{command}` lacks {missing}"


def test_licence_and_citation_exist_and_agree():
    assert (REPO_ROOT / "LICENSE").read_text().startswith("MIT License")
    citation = (REPO_ROOT / "CITATION.cff").read_text()
    assert re.search(r"^license: MIT$", citation, re.M) and "cff-version:" in citation
    assert "[`LICENSE`](LICENSE)" in README and "[`CITATION.cff`](CITATION.cff)" in README


def test_the_licence_is_an_spdx_string():
    """A licence table in pyproject.toml makes setuptools warn at every install."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]


def test_usage_comes_before_the_generated_results():
    assert README.index("## Command line") < README.index("<!-- BEGIN rpka summary")
    assert "[`docs/cli.md`](docs/cli.md)" in README


def test_the_readme_has_at_most_250_lines():
    """The first screen stays the answer and the two commands; details live in docs/."""
    assert len(README.splitlines()) <= 250


def test_the_first_screen_gives_the_two_commands():
    assert README.index("make report") < README.index("\n## ")
    assert README.index("make test") < README.index("\n## ")


def _tracked() -> set[str]:
    out = subprocess.run(
        ["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout
    return set(out.splitlines())


@pytest.mark.parametrize("doc", ["README.md", "docs/cli.md", "docs/layout.md", "docs/study.md"])
def test_every_relative_link_points_to_a_tracked_file(doc):
    """A link a reader follows from a clone: the file exists and is committed."""
    text = (REPO_ROOT / doc).read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    relative = [t for t in targets if "://" not in t and not t.startswith("mailto:")]
    assert relative
    base = (REPO_ROOT / doc).parent
    resolved = {t: str((base / t).resolve().relative_to(REPO_ROOT)) for t in relative}
    tracked = _tracked()
    if not tracked:  # not a git checkout: the files at least
        missing = [t for t, p in resolved.items() if not (REPO_ROOT / p).exists()]
    else:
        missing = [t for t, p in resolved.items() if p not in tracked]
    assert not missing, f"{doc} links to files a clone lacks: {missing}"


def test_make_help_names_the_readmes_default_preset():
    """`make help` and the README agree on what `make report` runs by default."""
    makefile = (REPO_ROOT / "Makefile").read_text()
    (line,) = [x for x in makefile.splitlines() if "make report [PRESET=" in x]
    assert "default standard" in line
    assert "the **standard study** (the default preset, `PRESET=standard`" in README
    for phrase in ("resumes the committed runs", "from scratch"):
        assert phrase in line and phrase in README


def test_no_tracked_file_points_outside_the_clone():
    """reports/executed/ does not exist in a clone (a reference outside the repository is
    test_architecture's)."""
    files = subprocess.run(
        [
            "git",
            "grep",
            "-l",
            "-e",
            "reports/executed",
            "--",
            ".",
            ":!tests/test_readme.py",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert files.returncode in (0, 1), files.stderr  # 1: no match
    assert files.stdout == ""


def test_the_layout_names_every_module():
    """Every module of the package has its line in docs/layout.md's block (a name or a
    pattern such as ``rpka/report/figures_*.py``), and every line names an existing one."""
    layout = (REPO_ROOT / "docs" / "layout.md").read_text()
    block = layout[layout.index("## Layout") :]
    names = [line.split()[0] for line in block.splitlines() if line.startswith("rpka/")]
    modules = [str(p.relative_to(REPO_ROOT)) for p in sorted((REPO_ROOT / "rpka").rglob("*.py"))]
    unnamed = [m for m in modules if not any(fnmatch.fnmatch(m, n) for n in names)]
    assert not unnamed, f"modules without a line in docs/layout.md: {unnamed}"
    stale = [n for n in names if not n.endswith("/") and not fnmatch.filter(modules, n)]
    assert not stale, f"docs/layout.md lines naming no module: {stale}"


def _generated_block() -> str:
    return README[README.index("<!-- BEGIN rpka summary") : README.index("<!-- END rpka summary")]


def test_the_readmes_hand_written_numbers_are_the_generated_sources():
    """One set of numbers (issue 56): the full study's recorded training CPU-s is its cost
    table's total (the long-range study included), the length from which the attention op
    is faster is the targets table's, and every measured time and the budget are those of
    rpka/config/measured.py - in the README, `make help`, docs/standard.md and docs/presets.md."""
    from rpka.config import measured
    from rpka.report import readme as summary

    results = summary.load_results("full")
    cost = summary.cost_table("full", results)
    cpu_s = int(cost["CPU s"].iloc[-1])
    assert f"{cpu_s:,} CPU-s of training runs recorded, ~{round(cpu_s / 7200)} h on 2 cores" in (
        README
    )
    assert cost["bench"].str.startswith("long range, 16 seeds").sum() >= 1
    targets = summary.targets_table(results, cost)
    faster = targets[targets["target"].str.startswith("CPU: faster than exact from n")]
    n = re.search(r"at n = ([\d,]+)", faster["measured"].iloc[0]).group(1)
    assert f"from about {n} tokens" in README
    help_text = subprocess.run(["make", "--no-print-directory", "help"], cwd=REPO_ROOT,
                               capture_output=True, text=True, check=True).stdout  # fmt: skip
    for m in (measured.REPORT_RESUMED, measured.REPORT_SCRATCH, measured.MAKE_TEST):
        assert f"| {m.what} | {m.minutes} min" in README, m
        assert m.where in README, m
        assert measured.help_minutes(m) in help_text, m
    assert f"budget {measured.BUDGET_MIN} min" in help_text
    assert f"the budget is {measured.BUDGET_MIN} min" in README
    assert f"≤ {measured.BUDGET_MIN} min wall" in (REPO_ROOT / "docs/standard.md").read_text()
    assert f"<= {measured.BUDGET_MIN} min wall" in (REPO_ROOT / "docs/presets.md").read_text()
    appendix = (REPO_ROOT / "notebooks/06_report.ipynb").read_text()
    assert not re.search(r"\d+ min|half an hour", appendix)  # times: the README's, not copies


def test_the_readmes_prose_is_short_lined_and_defines_its_terms():
    """A newcomer reads the README without the code (issue 56): prose lines of at most 100
    characters (tables, images and the generated block apart), every term defined, and a
    marked place for the decision study's answer (issue 53)."""
    prose = README.replace(_generated_block(), "")
    long = [line for line in prose.splitlines()
            if len(line) > 100 and not line.startswith(("|", "!["))]  # fmt: skip
    assert not long, long
    for term in ("*Points*", "queries and keys together", "*Gap recovered*", "*Non-inferior*",
                 "*n\\**", "*Negative control*", "*Positive control*", "*wiring check*",
                 "*(wall)*"):  # fmt: skip
        assert term in README, term
    assert "<!-- BEGIN decision study answer" in README
    assert "<!-- END decision study answer -->" in README


def test_the_readmes_decision_answer_cites_the_committed_reading():
    """The hand-written answer of issue 53 carries the committed reading's counts and words:
    seeds, failures, pairs and each answer (so a new look cannot leave it behind)."""
    import json

    entry = json.loads((REPO_ROOT / "data/results/full/study.json").read_text())["longrange_v2"]
    reading = entry["reading"]
    look = reading["final"] or reading["interim"]
    start = README.index("<!-- BEGIN decision study answer")
    block = " ".join(README[start : README.index("<!-- END decision study answer -->")].split())
    arms = entry["arms"]
    assert f"{entry['seeds_complete']} new seeds" in block
    assert (f"`rpka-r64` failed to learn on {arms['rpka-r64']['failures']['k']} and exact on "
            f"{arms['exact']['failures']['k']}") in block  # fmt: skip
    q1, q2 = look["q1"], look["q2"]
    assert f"where both learned ({q2['relative_mse']['pairs']} seeds)" in block
    assert f"where both learned ({q1['relative_mse']['pairs']} seeds)" in block
    for q in (q1, q2):  # RPKA failed where the other learned, and the reverse
        f = q["failures"]
        assert f"learned on {f['a_only']} seeds, the reverse on {f['b_only']}" in block
    assert q2["answer"] in block.lower() and q1["answer"] in block.lower()
    for question, answers in reading.get("decided_by_one_seed", {}).items():
        for answer in set(answers.values()):
            assert f"*{answer}*" in block, (question, answer)


def test_docs_swap_names_every_registered_method():
    from rpka.attention import REGISTRY

    text = (REPO_ROOT / "docs/swap.md").read_text()
    assert [name for name in REGISTRY if f"`{name}`" not in text] == []
