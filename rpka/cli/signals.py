"""How every command of ``python -m rpka`` stops (``rpka.cli.commands.main``): SIGINT and SIGTERM
raise :class:`Interrupted` in the driver, which exits ``128 + signum`` with one line
saying the same command resumes; a full disk is one line too (:data:`STORAGE_ERRNOS`)."""

from __future__ import annotations

import errno
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM in the driver: every command stops the same way (its pools
    aborted on the way out, ``rpka.training.executors.owned``), and exits ``128 + signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _stop(signum: int, frame: object) -> None:
    """Raise :class:`Interrupted`, once: later signals are ignored, so a second Ctrl-C
    cannot break the clean-up (killing the workers) half way and leave them running."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum)


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`Interrupted` in the main thread while a command
    runs. SIGTERM's default ended this process at once and left its workers to the
    parent-death signal (no message, no exit code of ours). A signal ignored at start
    stays ignored (a background job's SIGINT); the handlers are restored afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers (a test calling main() from a thread)
        return
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(sig, _stop)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def interrupted_status(err: KeyboardInterrupt) -> int:
    """One line on stderr, and the shell's code for the signal (130 Ctrl-C, 143 SIGTERM):
    every result file is whole (written, then renamed), so the same command resumes."""
    signum = getattr(err, "signum", signal.SIGINT)
    word = "interrupted" if signum == signal.SIGINT else "terminated"
    newline = "\n" if sys.stderr.isatty() else ""  # end a progress bar's line first
    print(
        f"{newline}{word}: the runs that finished are kept, and the same command resumes from them",
        file=sys.stderr,
        flush=True,
    )
    return 128 + signum


# a full disk, a quota, a read-only file system: one line, not a traceback
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
