"""The command line's argument checks, shared by every command (``rpka.cli``): output
paths probed before any work, ranges of counts, one error format with exit status 2."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from rpka.report import readme

# evaluation seeds a paired comparison can use: at least 2 pairs; at most what any study
# here would run (more is a typo, and 10**20 overflows the seed arithmetic)
SEEDS_RANGE = (2, 1_000)
# training epochs of a bench: the studies here train 1-8; a billion ran on silently
EPOCHS_RANGE = (1, 1_000)
# timed training steps per cost probe: 3 by default; 10**8 ran on silently
COST_STEPS_RANGE = (1, 1_000)


def check_out_dir(parser: argparse.ArgumentParser, flag: str, folder: Path) -> None:
    """Refuse, before any compute, an output folder that is a file or cannot be written
    (probe: create it and a temporary file in it)."""
    try:
        if folder.exists() and not folder.is_dir():
            parser.error(f"argument {flag}: {folder} is a file, not a folder")
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-probe-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        parser.error(f"argument {flag}: cannot write to {folder} ({err.strerror})")


NAME_MAX = 255  # bytes in one file name, on every common file system


def path_arg(value: str) -> str:
    """An ``--out`` value: refused when empty (``--out ''`` fell back to the default and
    overwrote a committed result file)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("an empty path; leave the option out for the default")
    return value


def check_out_file(parser: argparse.ArgumentParser, flag: str, path: Path) -> None:
    """Refuse, before any compute, an output file that is a folder or whose folder cannot
    be created and written (the result is written to a temporary file there, then renamed)."""
    try:
        if path.is_dir():
            parser.error(f"argument {flag}: {path} is a folder, not a file")
    except OSError as err:  # e.g. a name longer than the file system allows
        parser.error(f"argument {flag}: cannot write to {path} ({err.strerror})")
    if len(path.name.encode()) > NAME_MAX - len(".tmp") - 20:  # the temporary file's name
        parser.error(f"argument {flag}: the file name {path.name[:40]}... is too long")
    check_out_dir(parser, flag, path.parent)


def check_seeds(parser: argparse.ArgumentParser, n_seeds: int) -> None:
    """``--seeds``: a paired test needs 2 seeds; above 1,000 the run is a typo, not a study."""
    low, high = SEEDS_RANGE
    if not low <= n_seeds <= high:
        parser.error(f"argument --seeds: must be in [{low}, {high}], got {n_seeds}")


def eval_seeds(sweep_seeds: Sequence[int], n_seeds: int) -> tuple[int, ...]:
    """``n_seeds`` evaluation seeds, disjoint from the sweep seeds."""
    first = max(sweep_seeds) + 100
    return tuple(range(first, first + n_seeds))


def make_parser(command: str, description: str) -> argparse.ArgumentParser:
    """The one argparse setup of every command."""
    return argparse.ArgumentParser(
        prog=f"python -m rpka {command}",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def fail(command: str, message: str) -> NoReturn:
    """An error found once the options parsed (argparse's form and exit status 2)."""
    print(f"python -m rpka {command}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def readable_readme(parser: argparse.ArgumentParser, path: Path) -> str:
    """The README's text, refused before any work where it is not a file, cannot be read or
    written, or has no summary block."""
    try:
        if not path.is_file():
            parser.error(f"argument --readme: {path} is not a file")
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        parser.error(f"argument --readme: cannot read {path} ({err})")
    if readme.BEGIN not in text or readme.END not in text:
        parser.error(
            f"argument --readme: {path} has no summary block (the lines {readme.BEGIN!r} "
            f"and {readme.END!r})"
        )
    if not os.access(path, os.W_OK) or not os.access(path.parent or Path("."), os.W_OK):
        parser.error(f"argument --readme: {path} cannot be written (permissions)")
    return text
