"""The README a new user reads first: every command's options, licence and citation, and no
path that a clone does not have (issue 17 item 8)."""

import fnmatch
import re
import subprocess
import tomllib

import pytest

from rpka import cli
from rpka.paths import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()


def _command_line_section() -> str:
    start = README.index("\n## Command line\n")
    return README[start : README.index("\n## ", start + 1)]


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
    assert block and not missing, f"README's `{command}` lacks {missing}"


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
    """Every module of the package has its line in the README's layout block (a name or a
    pattern such as ``rpka/report/figures_*.py``), and every line names an existing one."""
    readme = (REPO_ROOT / "README.md").read_text()
    block = readme[readme.index("## Layout") : readme.index("## Licence")]
    names = [line.split()[0] for line in block.splitlines() if line.startswith("rpka/")]
    modules = [str(p.relative_to(REPO_ROOT)) for p in sorted((REPO_ROOT / "rpka").rglob("*.py"))]
    unnamed = [m for m in modules if not any(fnmatch.fnmatch(m, n) for n in names)]
    assert not unnamed, f"modules without a line in the README's layout: {unnamed}"
    stale = [n for n in names if not n.endswith("/") and not fnmatch.filter(modules, n)]
    assert not stale, f"README layout lines naming no module: {stale}"
