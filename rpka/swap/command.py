"""``python -m rpka swap``: the audit (:func:`rpka.swap.audit`) of a saved model.

    python -m rpka swap --model pkg.module:factory --weights model.pt --batch batch.pt \\
        --ranks 16 64 --methods rpka nystrom-uniform [--out DIR] [--option rpka.causal_block=16]

``factory()`` builds the model (no arguments), ``--weights`` is its ``state_dict`` saved
with ``torch.save``, ``--batch`` a ``torch.save``'d tensor, tuple/list (positional
arguments) or dict (keyword arguments) of model inputs - or ``{"inputs": ..., "targets":
...}``, which adds the loss as the end metric (cross-entropy for integer targets against
logits (..., V), mean squared error for float targets of the output's shape). Prints the
table and writes ``audit.json`` and ``audit.png`` to ``--out``. A factory that cannot be
imported or called, weights that do not load or do not fit, a batch the model does not
take: one line each (exit status 2), before any audit.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rpka.attention import REGISTRY
from rpka.io import write_json
from rpka.swap.measure import audit, plot_errors, primary_tensor, run_model
from rpka.swap.sdpa import SwapRefused

COLUMNS = ["method", "rank", "site", "swapped", "output_error", "logit_std", "rho",
           "predicted_rank", "error_at_predicted", "metric_change"]  # fmt: skip
TIMES = ["forward_ratio", "site_ratio"]


def fail(message: str) -> NoReturn:
    """One line on stderr, exit status 2 (argparse's form for a bad argument)."""
    print(f"python -m rpka swap: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m rpka swap",
        description="audit a saved model with its SDPA calls swapped (docs/swap.md)",
    )
    p.add_argument(
        "--model", required=True,
        help="pkg.module:factory or path/to/file.py:factory (called with no arguments)",
    )  # fmt: skip
    p.add_argument("--weights", type=Path, help="the model's state_dict (torch.save)")
    p.add_argument(
        "--batch", type=Path, required=True,
        help="torch.save'd inputs: a tensor, a tuple/list (positional) or a dict (keyword "
        'arguments); or {"inputs": ..., "targets": ...} to add the loss as the end metric',
    )  # fmt: skip
    p.add_argument(
        "--ranks", type=int, nargs="+", default=[16, 64],
        help="ranks (landmarks) to audit, integers >= 1; >= the keys of a call: exact "
        "(default %(default)s)",
    )  # fmt: skip
    p.add_argument("--methods", nargs="+", default=["rpka"], choices=sorted(REGISTRY))
    p.add_argument(
        "--option", action="append", default=[], metavar="METHOD.KEY=VALUE",
        help="a method's option, e.g. rpka.causal_block=16 (repeatable)",
    )  # fmt: skip
    p.add_argument(
        "--fallback", choices=("exact", "error"), default="exact",
        help="a call the method cannot serve: run it exactly (counted) or stop",
    )  # fmt: skip
    p.add_argument(
        "--repeats", type=int, default=3, help="timed rounds after a warm-up, >= 1 (default 3)"
    )
    p.add_argument(
        "--seed", type=int, default=0,
        help="the RNG seed every pass starts from (pivot draws) (default %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--out", type=Path, default=Path("rpka_swap_audit"),
        help="folder for audit.json and audit.png (default %(default)s)",
    )  # fmt: skip
    return p


def load_factory(spec: str) -> Callable[[], nn.Module]:
    """``pkg.module:factory`` or ``path/to/file.py:factory`` -> the callable (one line
    naming what is missing or what failed while importing it)."""
    module_name, _, name = spec.rpartition(":")
    if not module_name or not name:
        fail(f"argument --model: {spec!r} is not of the form pkg.module:factory or file.py:factory")
    try:
        if module_name.endswith(".py") or "/" in module_name:
            path = Path(module_name)
            if not path.is_file():
                fail(f"argument --model: no file {path}")
            loader = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except Exception as err:  # the user's module: a missing name or a failure inside it
        fail(f"argument --model: cannot import {module_name!r} ({type(err).__name__}: {err})")
    factory = getattr(module, name, None)
    if not callable(factory):
        fail(f"argument --model: {module_name!r} has no callable {name!r}")
    return factory


def build_model(factory: Callable[[], nn.Module], spec: str, weights: Path | None) -> nn.Module:
    """The factory's model with ``weights`` loaded (strictly)."""
    try:
        model = factory()
    except Exception as err:  # the user's code: any failure is one line
        fail(f"argument --model: {spec}() failed: {type(err).__name__}: {err}")
    if not isinstance(model, nn.Module):
        fail(f"argument --model: {spec}() returned {type(model).__name__}, not an nn.Module")
    if weights is None:
        return model
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except Exception as err:  # missing, not a torch file, a pickled module, ...
        fail(f"argument --weights: cannot load {weights} ({type(err).__name__}: {err})"[:300])
    if not isinstance(state, dict):
        fail(f"argument --weights: {weights} holds a {type(state).__name__}, not a state_dict")
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        fail(
            f"argument --weights: {weights} does not fit {spec}(): {len(missing)} missing "
            f"key(s) {_few(missing)}, {len(unexpected)} unexpected {_few(unexpected)}"
        )
    try:
        model.load_state_dict(state)
    except RuntimeError as err:  # the keys fit, a shape does not
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        fail(f"argument --weights: {weights} does not fit {spec}(): {lines[-1][:200]}")
    return model


def _few(names: list[str], shown: int = 3) -> str:
    return "[" + ", ".join(names[:shown]) + (", ...]" if len(names) > shown else "]")


def load_batch(path: Path) -> tuple[Any, Any]:
    """(inputs, targets or None) from the batch file."""
    try:
        batch = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        fail(f"argument --batch: cannot load {path} ({type(err).__name__}: {err})"[:300])
    if isinstance(batch, dict) and "inputs" in batch:
        return batch["inputs"], batch.get("targets")
    return batch, None


def describe(batch: Any) -> str:
    if isinstance(batch, Tensor):
        return f"{tuple(batch.shape)} {str(batch.dtype).replace('torch.', '')}"
    if isinstance(batch, dict):
        return "{" + ", ".join(f"{k}: {describe(v)}" for k, v in batch.items()) + "}"
    if isinstance(batch, tuple | list):
        return "(" + ", ".join(describe(v) for v in batch) + ")"
    return type(batch).__name__


def loss_metric(targets: Any) -> Callable[[Any], float] | None:
    """The loss against ``targets``: cross-entropy (integer targets, logits (..., V)) or
    mean squared error (float targets of the output's shape); None without targets."""
    if not isinstance(targets, Tensor):
        return None

    def loss(output: Any) -> float:
        out = primary_tensor(output)  # a Hugging Face ModelOutput: its logits
        if out is None:
            raise TypeError(f"the model's output {type(output).__name__} holds no tensor")
        if not targets.is_floating_point():
            return float(F.cross_entropy(out.flatten(0, -2).float(), targets.flatten()))
        return float(F.mse_loss(out.float(), targets.float()))

    return loss


def check_batch(model: nn.Module, batch: Any, metric: Callable[[Any], float] | None) -> None:
    """One plain forward, then the metric: inputs the model does not take, and targets the
    loss cannot compare with its output, are one line each, naming which."""
    try:
        with torch.no_grad():
            out = run_model(model, batch)
    except Exception as err:
        fail(f"argument --batch: the model does not take inputs {describe(batch)}: {_line(err)}")
    if metric is None:
        return
    try:
        metric(out)
    except Exception as err:
        scored = primary_tensor(out)
        shown = describe(scored) if scored is not None else type(out).__name__
        fail(
            f"argument --batch: the targets do not fit the model's output {shown} (the loss "
            f"needs logits (..., V) for integer targets, or the output's shape): {_line(err)}"
        )


def _line(err: Exception) -> str:
    return str(err).splitlines()[0] if str(err) else type(err).__name__


def check_out(folder: Path) -> None:
    """Refuse, before any work, an ``--out`` that is a file or cannot be written."""
    if folder.exists() and not folder.is_dir():
        fail(f"argument --out: {folder} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".write-probe"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        fail(f"argument --out: cannot write to {folder} ({err.strerror or err})")


def parse_options(items: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``METHOD.KEY=VALUE`` (a Python literal, else the string) -> {method: {key: value}}."""
    options: dict[str, dict[str, Any]] = {}
    for item in items:
        head, eq, value = item.partition("=")
        method, dot, key = head.rpartition(".")
        if not eq or not dot or method not in REGISTRY:
            fail(f"argument --option: {item!r} is not METHOD.KEY=VALUE with a known method")
        try:
            parsed: Any = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            parsed = value
        options.setdefault(method, {})[key] = parsed
    return options


def main(argv: Sequence[str] | None = None) -> pd.DataFrame:
    args = parser().parse_args(argv)
    if any(r < 1 for r in args.ranks) or args.repeats < 1:
        fail("arguments --ranks and --repeats: integers >= 1")
    options = parse_options(args.option)
    check_out(args.out)
    model = build_model(load_factory(args.model), args.model, args.weights)
    inputs, targets = load_batch(args.batch)
    metric = loss_metric(targets)
    check_batch(model, inputs, metric)
    try:
        table = audit(
            model, inputs, args.ranks, args.methods, metric,
            options=options, fallback=args.fallback, repeats=args.repeats, seed=args.seed,
        )  # fmt: skip
    except (SwapRefused, ValueError) as err:
        fail(str(err))
    shown = COLUMNS + (["metric"] if metric else []) + TIMES
    print(table[shown].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    record = {
        "what": "rpka.swap.audit of a saved model (docs/swap.md)",
        "model": args.model,
        "weights": str(args.weights) if args.weights else None,
        "batch": str(args.batch),
        "inputs": describe(inputs),
        "metric": "loss" if metric else None,
        **table.attrs,
        "rows": table.to_dict("records"),
    }
    write_json(args.out / "audit.json", record)
    plot_errors(table).savefig(args.out / "audit.png", dpi=120)
    print(f"written: {args.out / 'audit.json'}, {args.out / 'audit.png'}")
    return table
