"""One ``python -m rpka report`` of a preset at a time in a clone (issue 43, finding 2).

Two reports of one preset write the same executed notebooks (``reports/<preset>/*.ipynb``)
and figures: run at once they raced, and a notebook was left with two JSON documents run
together. :func:`report_lock` takes an exclusive ``flock`` on
``reports/<preset>/.rpka-report.lock`` for the whole command; a second report of the
preset is refused at once, naming the running one (its pid, command and start, which the
holder writes into the file). The operating system releases the lock when its process
ends, however it ends, so the file of a report that was killed (a dead pid) is simply
taken over by the next one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from rpka import paths
from rpka.paths import resolve

LOCK_FILE = ".rpka-report.lock"


class ReportRunning(RuntimeError):
    """Another report of the same preset holds the lock; the message names it."""


def lock_path(preset: str) -> Path:
    """The lock file of ``preset``'s reports (in ``reports/<preset>/``, ignored by git)."""
    return resolve(paths.report_dir(preset)) / LOCK_FILE


@contextlib.contextmanager
def report_lock(preset: str, command: str | None = None) -> Iterator[Path]:
    """Hold ``preset``'s report lock while the block runs; :class:`ReportRunning` at once
    if another process holds it. ``command`` (default: this process's arguments) is
    written into the file for the message a second report shows."""
    path = lock_path(preset)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = _acquire(path, preset)
    try:
        who = command or " ".join(["python -m rpka", *sys.argv[1:]])
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}, started {started}: {who}\n".encode(), 0)
        yield path
    finally:
        with contextlib.suppress(OSError):
            path.unlink()  # while still held: the next report makes a fresh file
        os.close(fd)  # releases the lock


def _acquire(path: Path, preset: str) -> int:
    """An open descriptor of ``path`` holding its exclusive lock. A file removed or
    replaced between its opening and its locking (its holder just ended) is opened again."""
    for _ in range(10):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "pid unknown"
            os.close(fd)
            raise ReportRunning(
                f"another report of preset {preset} is running in this clone ({holder}); "
                f"both would write the executed notebooks in {path.parent}: wait for it to "
                f"end (or stop it), then run this command again"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)
    raise ReportRunning(f"{path}: could not take the report lock (it keeps changing)")
