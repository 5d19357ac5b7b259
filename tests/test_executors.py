"""Executors: workers die with a killed driver; a Dask cluster gives the local pool's numbers."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

import rpka.bench as bench
from rpka.bench import run_bench
from rpka.cli import commands as cli
from rpka.config.presets import get_preset
from rpka.io import without_keys
from rpka.training.executors import EXECUTOR_KINDS, InProcessExecutor, local_executor, make_executor

ROOT = Path(__file__).resolve().parent.parent
# a driver that starts a pool of two workers, waits until both have run a job (so both
# are initialised), prints their pids and gives them long jobs
DRIVER = textwrap.dedent(
    """
    import os, sys, time
    from rpka.training import executors

    def pid_after(seconds):
        time.sleep(seconds)
        return os.getpid()

    if __name__ == "__main__":
        if sys.argv[1] == "dask":  # a LocalCluster the driver started, as --executor dask
            pool = executors.make_executor("dask", n_workers=2)
        else:
            pool = executors._process_pool(2, use_prctl=sys.argv[1] == "prctl")
        seen = set()
        while len(seen) < 2:
            seen |= {f.result() for f in [pool.submit(pid_after, 0.3) for _ in range(2)]}
        futures = [pool.submit(time.sleep, 120) for _ in range(2)]
        print(" ".join(str(pid) for pid in seen), flush=True)
        time.sleep(120)
    """
)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# "prctl": Linux's parent-death signal (and the poller); "poll": the portable poller alone;
# "dask": a local Dask cluster's worker processes (Dask's own watch on their nanny)
@pytest.mark.parametrize("mechanism", ["prctl", "poll", "dask"])
def test_workers_exit_when_the_driver_is_killed(mechanism, tmp_path):
    if mechanism == "dask":
        pytest.importorskip("distributed")
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    driver = subprocess.Popen(
        [sys.executable, str(script), mechanism], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        workers = [int(pid) for pid in driver.stdout.readline().split()]
        assert len(workers) == 2 and all(_alive(pid) for pid in workers)
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=10)
        # generous deadlines (the poller wakes every 0.5 s): a loaded machine must not fail it
        deadline = time.monotonic() + (60 if mechanism == "dask" else 20)
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        orphans = [pid for pid in workers if _alive(pid)]
        assert not orphans, f"workers {orphans} outlived their killed driver"
    finally:
        driver.kill()
        for pid in workers if "workers" in locals() else []:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_make_executor_names():
    assert isinstance(make_executor("inline"), InProcessExecutor)
    assert isinstance(local_executor(1), InProcessExecutor)
    assert EXECUTOR_KINDS == ("local", "inline", "dask")
    with pytest.raises(ValueError, match="executor must be one of"):
        make_executor("threads")


# timings and the process that ran a job differ between executors, and so does the
# checksum that covers them; nothing else may. The weights' checksum (state_sha256, null
# when a run kept none) says which runs kept weights, which follows the stages asked for
# (the CLI's smoke preset runs the mechanism study; DASK_SMOKE does not), not the executor
VARYING_KEYS = {"wall_s", "cpu_s", "step_ms_median", "sha256", "state_sha256"}


def _run_files(out: Path) -> dict[str, dict]:
    """Each run file and the bench report (its sweep, statistics and verdicts: everything
    but ``timings``), without what differs between executors."""
    files = sorted((out / "runs").glob("*.json"))
    assert files
    runs = {
        f.name: {k: v for k, v in json.loads(f.read_text()).items() if k not in VARYING_KEYS}
        for f in files
    }
    report = json.loads((out / "bench_report.json").read_text())
    runs["bench_report.json"] = without_keys(report, frozenset(VARYING_KEYS | {"timings"}))
    return runs


# the smoke study without its driver-side studies, one epoch, two workers: the runs the
# Dask tests compare (the CLI's ``--preset smoke --epochs 1 --workers 2`` runs the same jobs)
DASK_SMOKE = get_preset(
    "smoke", train={"epochs": 1}, mechanism=None, output_error_ranks=(), n_workers=2
)
CLI_SMOKE = ["--preset", "smoke", "--epochs", "1", "--workers", "2", "--no-progress"]


@pytest.fixture(scope="module")
def local_pool_runs(tmp_path_factory) -> tuple[dict[str, dict], Path]:
    """(run files without timings, track cache) of the smoke study on the local pool."""
    root = tmp_path_factory.mktemp("local_pool")
    with make_executor("local", n_workers=2) as executor:
        run_bench(DASK_SMOKE, root / "out", executor, progress=False, data_dir=root / "cache")
    runs = _run_files(root / "out")
    for run in (r for name, r in runs.items() if name != "bench_report.json"):  # trained
        assert all(v is not None for v in run["scores"].values())
    return runs, root / "cache"


@pytest.mark.slow
def test_dask_local_cluster_matches_the_local_pool(local_pool_runs, tmp_path):
    pytest.importorskip("distributed")
    expected, cache = local_pool_runs
    with make_executor("dask", n_workers=2) as executor:
        run_bench(DASK_SMOKE, tmp_path / "dask", executor, progress=False, data_dir=cache)
    assert _run_files(tmp_path / "dask") == expected


@pytest.mark.slow
def test_a_single_process_matches_the_local_pool(local_pool_runs, tmp_path):
    """The inline executor (the driver's own process) gives the pool's numbers bit for bit,
    sweep and statistics included: every process runs the same pinned kernels."""
    expected, cache = local_pool_runs
    run_bench(DASK_SMOKE, tmp_path / "inline", InProcessExecutor(), progress=False,
              data_dir=cache)
    assert _run_files(tmp_path / "inline") == expected


@pytest.mark.slow
@pytest.mark.parametrize("where", ["scheduler", "executor"])
def test_bench_cli_on_dask_matches_the_local_pool(where, local_pool_runs, tmp_path, monkeypatch):
    """``python -m rpka bench --scheduler tcp://...`` (a cluster started here) and
    ``--executor dask`` (a local cluster the CLI starts) exit 0 with the local pool's runs."""
    distributed = pytest.importorskip("distributed")
    expected, cache = local_pool_runs
    monkeypatch.setattr(bench, "DEFAULT_DATA_DIR", cache)  # not the repository's data/cache
    argv = ["bench", *CLI_SMOKE, "--out", str(tmp_path / "out")]
    if where == "executor":
        assert cli.main([*argv, "--executor", "dask"]) == 0
    else:
        with distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
        ) as cluster:
            assert cluster.scheduler_address.startswith("tcp://")
            assert cli.main([*argv, "--scheduler", cluster.scheduler_address]) == 0
            assert cluster.scheduler.transition_counter > 0  # the jobs ran on this cluster
            # the CLI closed its client, not the cluster it was given
            assert cluster.status.name == "running"
    assert (tmp_path / "out" / "bench_report.json").is_file()
    # the run files: the CLI's smoke preset also runs the mechanism study into its report
    runs = {name: run for name, run in expected.items() if name != "bench_report.json"}
    assert {k: v for k, v in _run_files(tmp_path / "out").items() if k in runs} == runs
