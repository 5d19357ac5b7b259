"""The architecture as a contract (docs/design.md, "Layout"): the import layers of
pyproject.toml's ``[tool.importlinter]``, no import cycles, no imports hidden in functions,
no module over 500 lines, no function over 80, no reference outside the repository, no
track name outside ``rpka/tracks``, every top-level module in the contract and in
docs/design.md section 8, no path built outside ``rpka.paths`` by ``rpka.study.steps`` or
``rpka.study.index``, no ``nonlocal``."""

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "rpka"
MAX_LINES = 500
MAX_FUNCTION_LINES = 80  # a function's lines, its docstring included


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_import_layers_hold():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which(
        "lint-imports"
    )
    if lint is None:
        pytest.fail("lint-imports not found: pip install -e '.[test]' installs import-linter")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([lint], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def _cycle(graph: grimp.ImportGraph, names: set[str]) -> list[str] | None:
    """A cycle among ``names`` (a list of modules), or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        stack.append(name)
        for nxt in sorted(graph.find_modules_directly_imported_by(name) & names):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[name] = 2
        return None

    for name in sorted(names):
        if name not in state and (found := visit(name)):
            return found
    return None


def test_no_import_cycles():
    sys.path.insert(0, str(ROOT))
    graph = grimp.build_graph("rpka")
    assert _cycle(graph, set(graph.modules)) is None


def test_no_imports_hidden_in_functions():
    hidden = []
    for path in modules():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Import | ast.ImportFrom):
                        hidden.append(f"{path.relative_to(ROOT)}:{inner.lineno}")
    assert not hidden, f"imports inside functions: {hidden}"


def test_no_module_over_the_line_limit():
    long = {
        str(p.relative_to(ROOT)): n
        for p in modules()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_no_function_over_the_line_limit():
    long = [
        f"{p.relative_to(ROOT)}: {node.name} {n} lines"
        for p in modules()
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (n := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES
    ]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_no_reference_outside_the_repository():
    pattern = re.compile(r"\.\./" + "shared")  # split: this file does not match itself
    files = [
        p
        for p in ROOT.rglob("*")
        if p.is_file()
        and p.suffix in {".py", ".md", ".ipynb", ".toml", ".yml", ".yaml", ".cfg", ".txt"}
        and not any(part.startswith(".") for part in p.relative_to(ROOT).parts)
        and "data" not in p.relative_to(ROOT).parts[:1]
    ]
    offenders = [str(p.relative_to(ROOT)) for p in files if pattern.search(p.read_text())]
    assert not offenders, f"files referring outside the repository: {offenders}"


def test_no_branch_on_a_track_name_outside_tracks():
    """A track's name appears as a literal only in rpka/tracks and in the registries of
    presets (rpka/config/presets.py maps track names to their presets)."""
    from rpka.tracks import TRACKS

    names = "|".join(re.escape(n) for n in TRACKS)
    pattern = re.compile(rf"""(==|!=|\bin)\s*["']({names})["']|["']({names})["']\s*(==|!=)""")
    offenders = []
    for path in modules():
        if PACKAGE / "tracks" in path.parents:
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_paths_are_owned_by_rpka_paths_alone():
    """``rpka.paths`` is the one owner of the layout: ``rpka.study.steps`` and
    ``rpka.study.index`` build no path of their own - no function named like a path and
    none sharing a name with ``rpka.paths``; no result file named by a literal."""
    from rpka import paths
    from rpka.study import index as study_index
    from rpka.study import steps as study

    def functions(module: object) -> set[str]:
        return {
            name
            for name, value in vars(module).items()
            if callable(value) and getattr(value, "__module__", None) == module.__name__
        }

    for module in (study, study_index):
        own = functions(module)
        assert not own & set(vars(paths)), (module.__name__, own & set(vars(paths)))
        assert not {n for n in own if n.endswith(("_dir", "_json", "_path"))}, own
        text = Path(module.__file__).read_text()
        named = {v for k, v in vars(paths).items() if k.endswith("_FILE") and f'"{v}"' in text}
        assert not named, f"{module.__name__} names {named} itself: use rpka.paths"


def _design_layout() -> list[list[str]]:
    """docs/design.md section 8's module list: top-level modules in layer groups (blank
    lines between layers), each name as written (a package with a trailing ``/``)."""
    text = (ROOT / "docs" / "design.md").read_text()
    section = text[text.index("## 8. Layout") : text.index("## 9.")]
    lines = section[: section.index("Where to add:")].splitlines()
    block = lines[next(i for i, line in enumerate(lines) if line.startswith("    ")) :]
    groups: list[list[str]] = [[]]
    for line in block:
        if not line.strip():
            if groups[-1]:
                groups.append([])
        elif line.startswith("    ") and not line.startswith("     "):  # a top-level entry
            groups[-1].append(line.split()[0])
        elif not line.startswith("      "):  # text after the block
            break
    return [group for group in groups if group]


def _top_level_modules() -> set[str]:
    return {p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")} | {
        p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()
    }


def test_design_lists_every_top_level_module_once_in_its_layer():
    """docs/design.md section 8 names each top-level module (and package) of rpka once,
    grouped as pyproject.toml's layer contract groups them, in the same order."""
    groups = _design_layout()
    listed = [name.rstrip("/") for group in groups for name in group]
    assert sorted(listed) == sorted(_top_level_modules()), (
        f"missing: {sorted(_top_level_modules() - set(listed))}, "
        f"not modules: {sorted(set(listed) - _top_level_modules())}"
    )
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = config["contracts"][0]["layers"]
    contract = [sorted(n.strip() for n in re.split(r"[|:]", layer)) for layer in layers]
    assert [sorted(n.rstrip("/") for n in group) for group in groups] == contract


def test_every_top_level_module_is_in_the_layer_contract():
    """A module outside the contract is unchecked: every one has a layer."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = config["contracts"][0]["layers"]
    named = {n.strip() for layer in layers for n in re.split(r"[|:]", layer)}
    assert _top_level_modules() <= named, sorted(_top_level_modules() - named)


def test_no_closure_shares_state_by_nonlocal():
    """State that outlives a call lives in an object (e.g. ``rpka.bench.jobs.Scheduler``),
    not in variables closures rebind with ``nonlocal``."""
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in modules()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Nonlocal)
    ]
    assert not found, f"nonlocal: {found}"


def test_design_lists_every_report_module_in_the_package_contract():
    """Each module of ``rpka/report/`` (one per section, and what they share) has a line in
    docs/design.md section 8 and a layer in the ``rpka.report`` contract."""
    text = (ROOT / "docs" / "design.md").read_text()
    section = text[text.index("## 8. Layout") : text.index("## 9.")]
    listed = re.findall(r"^      report/(\w+)", section, flags=re.M)
    package = {p.stem for p in (PACKAGE / "report").glob("*.py")}
    assert sorted(listed) == sorted(package)
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in contracts["contracts"] if c.get("containers") == ["rpka.report"]]
    named = [n.strip() for layer in contract["layers"] for n in layer.split("|")]
    assert sorted(named) == sorted(package - {"__init__"})
