"""The notebooks' parameters, checked where they are consumed: the first cell after the
``parameters`` cell of each notebook calls :func:`settle`.

A notebook's parameter cell names its ``preset`` and sets every path to ``None``: a path
left ``None`` is derived from ``preset`` (``rpka.study.steps.notebook_parameters``), so
``papermill ... -p preset quick`` reads and writes the quick study's files, never the
smoke defaults'. A path passed explicitly is kept. A name the notebook does not declare
(``-p presett quick``), a preset that is not one (``-p preset quik``) or a value of the
wrong type (``-p bench_report 42``) stops the notebook at that cell with one line naming
the parameter and what it accepts (:class:`ParameterError`), before any work.

:func:`check` is the same check on a plain mapping (``rpka.cli.pipeline`` runs it before it
starts a kernel).
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Mapping, Sequence
from typing import Any

from rpka.config.presets import STUDY_PRESETS
from rpka.study.steps import NOTEBOOKS, notebook_parameters

# every notebook's switches: (default, what it does)
FLAGS: dict[str, tuple[bool, str]] = {
    "compute_missing": (True, "False: read the results, compute nothing (report --from-results)"),
}
# the integer parameters (not the preset, not a path): (default, lowest, highest)
NUMBERS: dict[str, dict[str, tuple[int, int, int]]] = {
    "01_train.ipynb": {"n_windows_shown": (3, 1, 20)},
}
# a user's own inputs, None unless given: a non-empty string each (notebook 07 audits the
# user's model: ``python -m rpka swap``'s --model, --weights and --batch)
USER_TEXTS: dict[str, tuple[str, ...]] = {
    "07_your_model.ipynb": ("user_model", "user_weights", "user_batch"),
}
# lists of positive integers: (default, what they are)
RANK_LISTS: dict[str, dict[str, list[int]]] = {
    "07_your_model.ipynb": {"user_ranks": [16, 64]},
}


class ParameterError(ValueError):
    """A notebook parameter that is unknown, mistyped or out of range; its message is the
    one line a notebook shows (no traceback: IPython prints ``_render_traceback_``)."""

    def _render_traceback_(self) -> list[str]:
        return [f"ParameterError: {self}"]


def declared(notebook: str) -> list[str]:
    """The parameters ``notebook`` (a file name in ``rpka.study.steps.NOTEBOOKS``) takes."""
    if notebook not in NOTEBOOKS:
        raise ParameterError(f"notebook {notebook!r}: not one of {', '.join(NOTEBOOKS)}")
    return [
        *notebook_parameters("smoke")[notebook],
        *NUMBERS.get(notebook, {}),
        *FLAGS,
        *USER_TEXTS.get(notebook, ()),
        *RANK_LISTS.get(notebook, {}),
    ]


def check(notebook: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """Every parameter of ``notebook``: those ``given`` (checked), the paths not given (or
    ``None``) derived from the preset, the numbers' defaults. Raises
    :class:`ParameterError` naming the first parameter that is unknown or wrong."""
    names = declared(notebook)
    for name in given:
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ParameterError(
                f"{notebook}: unknown parameter {name!r}{hint}; it takes {', '.join(names)}"
            )
    preset = given.get("preset")
    if preset is None:
        preset = "smoke"
    if not isinstance(preset, str) or preset not in STUDY_PRESETS:
        close = difflib.get_close_matches(str(preset), STUDY_PRESETS, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ParameterError(
            f"{notebook}: parameter preset must be one of {', '.join(STUDY_PRESETS)}, "
            f"got {preset!r}{hint}"
        )
    derived = notebook_parameters(preset)[notebook]
    out: dict[str, Any] = {}
    for name in names:
        value = given.get(name)
        if name in NUMBERS.get(notebook, {}):
            out[name] = _number(notebook, name, value)
        elif name in USER_TEXTS.get(notebook, ()):
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ParameterError(
                    f"{notebook}: parameter {name} must be a non-empty string or None, "
                    f"got {value!r}"
                )
            out[name] = value
        elif name in RANK_LISTS.get(notebook, {}):
            out[name] = _ranks(notebook, name, value)
        elif name in FLAGS:
            if value is not None and not isinstance(value, bool):
                raise ParameterError(
                    f"{notebook}: parameter {name} must be True or False, got {value!r}"
                )
            out[name] = FLAGS[name][0] if value is None else value
        elif name == "preset":
            out[name] = preset
        elif value is None:
            out[name] = derived[name]
        elif not isinstance(value, str) or not value.strip():
            raise ParameterError(
                f"{notebook}: parameter {name} must be a path (a non-empty string) or None "
                f"for {derived[name]!r}, got {value!r}"
            )
        else:
            out[name] = value
    return out


def _ranks(notebook: str, name: str, value: object) -> list[int]:
    if value is None:
        return list(RANK_LISTS[notebook][name])
    ok = isinstance(value, list | tuple) and value and all(
        isinstance(r, int) and not isinstance(r, bool) and r >= 1 for r in value
    )
    if not ok:
        raise ParameterError(
            f"{notebook}: parameter {name} must be a list of integers >= 1, got {value!r}"
        )
    return list(value)


def _number(notebook: str, name: str, value: object) -> int:
    default, low, high = NUMBERS[notebook][name]
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ParameterError(
            f"{notebook}: parameter {name} must be an integer in [{low}, {high}], got {value!r}"
        )
    return value


def assigned_literals(cells: Sequence[str]) -> dict[str, Any]:
    """The names that ``cells`` (sources, in order) assign in cells made only of
    ``name = <literal>`` lines - the parameters cell and papermill's injected one - with
    the last value each got. Other cells (imports, computations) are not parameters."""
    found: dict[str, Any] = {}
    for source in cells:
        try:
            body = ast.parse(source).body
        except SyntaxError:
            continue
        pairs = []
        for node in body:
            if not (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                break
            try:
                pairs.append((node.targets[0].id, ast.literal_eval(node.value)))
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                break
        else:
            found.update(pairs)
    return found


def settle(notebook: str, namespace: dict[str, Any]) -> dict[str, Any]:
    """Check the parameters of ``notebook`` in ``namespace`` (the notebook's ``globals()``)
    and set the derived ones there; returns them all.

    The names given are those the cells run so far assigned as literals (IPython's ``In``:
    the parameters cell and papermill's injected cell), so a mistyped name is caught even
    though the kernel accepted it; the values checked are the namespace's."""
    history = namespace.get("In") or []
    given = assigned_literals([str(cell) for cell in history[1:-1]])
    values = {name: namespace.get(name) for name in given}
    for name in declared(notebook):
        values.setdefault(name, namespace.get(name))
    settled = check(notebook, values)
    namespace.update(settled)
    return settled
