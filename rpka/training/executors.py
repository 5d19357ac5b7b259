"""Where the bench's jobs run: the ``concurrent.futures`` seam of docs/design.md section 9.

A job is a pure function of its configuration that writes one result file, so any
``concurrent.futures.Executor`` can run it:

- ``inline``: :class:`InProcessExecutor`, each job runs at ``submit`` (tests, debugging);
- ``local``: :func:`local_executor`, a pool of spawned processes that exit when the
  driver dies (no orphan keeps training and writing files after a ``kill -9``);
- ``dask``: :func:`dask_executor`, a ``distributed.Client(...).get_executor()`` on a
  ``LocalCluster`` of single-threaded worker processes, or on the scheduler at a
  ``tcp://`` address, for a sweep that outgrows one machine.

Every executor runs a job with one torch thread, so the same job gives the same numbers
on any of them (the test compares a local pool and a Dask cluster bit for bit).

Interrupts: a terminal's Ctrl-C reaches every process of the group, so the local pool's
workers ignore SIGINT and the driver alone decides. Whoever owns an executor closes it
with :func:`owned`: a normal exit waits for the jobs, an exception (Ctrl-C, SIGTERM, a
failed job) aborts it (:func:`abort`: queued jobs cancelled, running ones killed), so the
process exits at once instead of finishing (or waiting for) jobs nobody will read. A
killed job leaves no file (each is written to a temporary file, then renamed), so the
next run resumes from the jobs that finished.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import ctypes
import importlib
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
from tqdm import tqdm

EXECUTOR_KINDS = ("local", "inline", "dask")
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>: signal this process when its parent dies
PARENT_POLL_S = 0.5  # the portable fallback's polling period
# how long an aborted pool's workers get to exit after SIGTERM before SIGKILL: a training
# step is in C (torch) and SIGTERM's default action ends it at once, so this is a backstop
TERMINATE_GRACE_S = 2.0


class InProcessExecutor(cf.Executor):
    """A ``concurrent.futures.Executor`` that runs each job at ``submit`` (tests, debugging)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future:
        future: cf.Future = cf.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM in the job: the command stops now.
            raise  # Kept in the future, it waited for the caller's result(): a long-context
            # memory probe's interrupt surfaced after the whole bench (issue 43: ~1 min)
        except BaseException as err:  # delivered through the future, as a pool would
            future.set_exception(err)
        return future

    def abort(self) -> None:
        """Nothing runs in the background: a job interrupted at ``submit`` is already over."""


# --------------------------------------------------------------------------- local pool


def _exit_when_orphaned(parent_pid: int) -> None:
    """Poll ``os.getppid()``: once the parent is gone we have been re-parented; exit."""
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def _die_with_parent(parent_pid: int, use_prctl: bool = True) -> None:
    """Make this worker exit when ``parent_pid`` dies, even by ``kill -9``.

    On Linux the kernel sends SIGTERM at the parent's death (``prctl(PR_SET_PDEATHSIG)``);
    everywhere a daemon thread also polls the parent pid (macOS has no prctl).
    """
    if use_prctl and sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, 15, 0, 0, 0)  # 15 = SIGTERM
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)
    threading.Thread(target=_exit_when_orphaned, args=(parent_pid,), daemon=True).start()


def _thread_lock_for_bars() -> None:
    """tqdm's default lock holds a multiprocessing semaphore, which the resource tracker
    lists until the process frees it; a worker killed by :func:`abort` never does, and the
    tracker warned of "leaked semaphore objects" at exit. A worker shares no lock with
    another process: a thread lock is all its job's bar needs (set once per process)."""
    global _BARS_LOCKED
    if not _BARS_LOCKED:
        tqdm.set_lock(threading.RLock())
        _BARS_LOCKED = True


_BARS_LOCKED = False


def _init_worker(parent_pid: int, use_prctl: bool = True) -> None:
    # Ctrl-C reaches the whole process group: a worker that took it printed a traceback
    # (idle) or handed the KeyboardInterrupt back as its job's result and took the next job
    # (busy). The driver decides instead (LocalPool.abort); SIGTERM still ends a worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _thread_lock_for_bars()
    _die_with_parent(parent_pid, use_prctl)
    torch.set_num_threads(1)  # one thread per worker: the workers already use every core


class LocalPool(cf.ProcessPoolExecutor):
    """A process pool that can be stopped now: :meth:`abort`."""

    def abort(self) -> None:
        """Cancel the queued jobs and kill the running ones (SIGTERM, then SIGKILL after
        ``TERMINATE_GRACE_S``), without waiting for any job.

        ``shutdown(cancel_futures=True)`` alone waits for the running jobs (minutes each in
        the full study), and with ``wait=False`` leaves the workers alive, so the
        interpreter's exit then waits for them in ``multiprocessing``'s exit handler.
        """
        workers = list((self._processes or {}).values())  # shutdown forgets them
        self.shutdown(wait=False, cancel_futures=True)
        for worker in workers:
            worker.terminate()
        deadline = time.monotonic() + TERMINATE_GRACE_S
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
            if worker.is_alive():
                worker.kill()
                worker.join()


def _process_pool(n_workers: int, use_prctl: bool = True) -> LocalPool:
    return LocalPool(
        max_workers=n_workers,
        mp_context=multiprocessing.get_context("spawn"),  # no inherited torch thread state
        initializer=_init_worker,
        initargs=(os.getpid(), use_prctl),
    )


def local_executor(n_workers: int) -> cf.Executor:
    """In-process for one worker, else a pool of ``n_workers`` spawned processes.

    The workers exit when this process dies. Linux's parent-death signal is tied to the
    thread that started the worker, so submit from a thread that outlives the pool (the
    bench submits from the calling thread).
    """
    if n_workers <= 1:
        return InProcessExecutor()
    return _process_pool(n_workers)


# --------------------------------------------------------------------------- dask


def _single_threaded(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    # the local pool's workers run one torch thread; a Dask worker must too, for the same
    # numbers (a different thread count can change the order of a float reduction)
    torch.set_num_threads(1)
    _thread_lock_for_bars()
    return fn(*args, **kwargs)


class DaskExecutor(cf.Executor):
    """A Dask client's executor that owns its client (and local cluster): ``shutdown``
    closes them."""

    def __init__(self, client: Any, cluster: Any = None) -> None:
        self.client, self.cluster = client, cluster
        self._executor = client.get_executor(pure=False)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future:
        return self._executor.submit(_single_threaded, fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if cancel_futures:
            for future in list(self._executor._futures):
                future.cancel()
        self._executor.shutdown(wait=wait and not cancel_futures)
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()

    def abort(self) -> None:
        """Kill the local cluster's workers, cancel every job and close the client and
        the cluster; a cluster at an address is not ours: its jobs are cancelled only.

        A running job is a thread that Dask cannot stop: each nanny waited 4 s for it,
        then killed its worker, and both logged warnings on the way.
        """
        for nanny in list(getattr(self.cluster, "workers", {}).values()):
            pid = getattr(nanny, "pid", None)  # None once its worker process has ended
            if pid:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        self.shutdown(wait=False, cancel_futures=True)


# how long a scheduler address is tried before the bench gives up on it
DASK_CONNECT_TIMEOUT_S = 10.0


def dask_executor(address: str | None = None, n_workers: int = 2) -> DaskExecutor:
    """A Dask executor: on the scheduler at ``address`` (``tcp://host:port``), else on a
    new ``LocalCluster`` of ``n_workers`` single-threaded processes (loopback only, no
    dashboard)."""
    try:  # optional (pip install "rpka[dask]"), and loaded only here: ~0.5 s per process
        distributed = importlib.import_module("distributed")
    except ImportError as err:  # pragma: no cover - the test extra installs it
        raise ImportError('the dask executor needs dask: pip install "rpka[dask]"') from err
    if address is not None:  # unreachable: OSError after the timeout (distributed's: 30 s)
        return DaskExecutor(distributed.Client(address, timeout=DASK_CONNECT_TIMEOUT_S))
    if n_workers < 1:
        raise ValueError(f"n_workers must be >= 1, got {n_workers}")
    cluster = distributed.LocalCluster(
        n_workers=n_workers,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
    )
    return DaskExecutor(distributed.Client(cluster), cluster)


def make_executor(kind: str = "local", n_workers: int = 1) -> cf.Executor:
    """The executor named ``kind``: ``local`` (process pool), ``inline`` (in-process),
    ``dask`` (a local Dask cluster of ``n_workers``) or a Dask scheduler's address
    (``tcp://host:port``). The caller shuts it down (``with make_executor(...) as ex:``).
    """
    if kind == "local":
        return local_executor(n_workers)
    if kind == "inline":
        return InProcessExecutor()
    if kind == "dask":
        return dask_executor(n_workers=max(1, n_workers))
    if "://" in kind:  # tcp://host:port, tls://..., as the scheduler prints it
        return dask_executor(address=kind)
    raise ValueError(
        f"executor must be one of {EXECUTOR_KINDS} or a Dask scheduler address "
        f"tcp://host:port, got {kind!r}"
    )


# --------------------------------------------------------------------------- closing

ExecutorT = TypeVar("ExecutorT", bound=cf.Executor)


def abort(executor: cf.Executor) -> None:
    """Stop ``executor`` now: queued jobs cancelled, running ones killed where the
    executor can (:meth:`LocalPool.abort`, :meth:`DaskExecutor.abort`); any other
    ``concurrent.futures`` executor is shut down without waiting."""
    stop = getattr(executor, "abort", None)
    if stop is not None:
        stop()
    else:
        executor.shutdown(wait=False, cancel_futures=True)


@contextlib.contextmanager
def owned(executor: ExecutorT) -> Iterator[ExecutorT]:
    """``with owned(make_executor(...)) as executor:`` - on a normal exit wait for its jobs
    and shut it down; on an exception (Ctrl-C, SIGTERM, a failed job) :func:`abort` it.

    ``with executor:`` would wait for every job already submitted, Ctrl-C or not: the
    process then finished them (or hung) instead of exiting.
    """
    try:
        yield executor
    except BaseException:
        abort(executor)
        raise
    executor.shutdown(wait=True)
