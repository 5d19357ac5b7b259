"""Attention latency and peak memory against sequence length and rank (docs/design.md section 7).

Every method is measured in one process on the same inputs, so the ratios against
``exact`` are within one run. For each length n and arm (``exact``; ``rpka`` at each rank;
the control ``nystrom-uniform`` = ``rpka`` with ``pivot_rule="uniform"``) it records:

* ``forward_ms``: median forward latency after warm-up, without gradients (inference);
* ``fwd_bwd_ms``: median latency of forward + backward (``torch.autograd.grad`` of the
  output against a fixed random cotangent, w.r.t. q, k and v);
* ``pivot_ms``: for RPKA arms, the pivot selection alone (median), and
  ``pivot_fraction = pivot_ms / forward_ms``;
* ``peak_mib`` / ``fwd_bwd_peak_mib``: peak memory of one call above what was allocated
  before it (the inputs). CUDA: ``torch.cuda.max_memory_allocated()`` after
  ``reset_peak_memory_stats()``, minus ``torch.cuda.memory_allocated()`` just before the
  call. CPU: the running sum of the tensor allocations and frees that
  ``torch.profiler`` records (``profile_memory=True``), at operator granularity - it
  counts PyTorch tensors only and misses a buffer that lives and dies inside one operator,
  so it is a lower bound of the true peak (not RSS).

Timing: CUDA events around each call after warm-up (the events bracket the whole call on
the stream, host synchronisations inside it included); CPU: ``time.perf_counter``. A
measurement that runs out of memory is recorded as ``"oom"`` (and the larger lengths of
that measurement are ``"skipped"``), one that fails otherwise as ``"error: ..."`` (likewise),
one past the time budget as ``"skipped"``, and so is one predicted to overrun what is left
of it (``<measure>_predicted_s``: from the arm's last length, or a one-call probe at 1,024
tokens, scaled by n^2 for exact attention and n for the others). The JSON is
rewritten after every measurement, so an interrupted run keeps what it measured.

    python -m rpka scaling --preset cpu          # -> data/results/scaling/cpu.json
    python -m rpka scaling --preset gpu          # -> data/results/scaling/gpu_h200.json

A sweep's configuration, its presets and the arms it measures: ``rpka.config.scaling``.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, replace
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

try:
    from tqdm import tqdm
except ImportError:  # pragma: no cover - a bare GPU box with torch only: no progress bar
    tqdm = None

from rpka import numerics
from rpka.attention import build, triton_sweep
from rpka.config.scaling import (
    ARM_LENGTH,  # noqa: F401 - read as scaling.ARM_LENGTH (rpka.cli.commands)
    CONTROL,
    DEFAULT_OUT,  # noqa: F401 - read as scaling.DEFAULT_OUT (rpka.cli.commands)
    DTYPES,
    SCALING_PRESETS,  # noqa: F401 - read as scaling.SCALING_PRESETS (rpka.cli)
    ScalingConfig,
    arms,
    bench_arms_config,  # noqa: F401 - read as scaling.bench_arms_config (rpka.cli.commands)
)
from rpka.io import write_result_json
from rpka.speed.timing import interleaved

MiB = 2**20


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_call(fn: Callable[[], object], device: str, warmup: int, repeats: int) -> list[float]:
    """Latency of ``fn`` in milliseconds, ``repeats`` times after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        if device == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def peak_memory_mib(fn: Callable[[], object], device: str) -> float:
    """Peak memory of one call of ``fn`` above what was allocated before it, in MiB."""
    if device == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / MiB
    # kineto, behind torch.profiler, logs a "USDT" trace-marker line at every profiler start
    # and stop (its level 5, above ERROR): 48 lines per report. It reads the level once, at
    # the first profile; 6 silences kineto's own log (a failed profile still raises here),
    # and a KINETO_LOG_LEVEL the user set wins.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    deltas = sorted(
        (
            e.time_range.start,
            e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage,
        )
        for e in prof.events()
    )
    running = peak = 0
    for _, delta in deltas:
        running += delta
        peak = max(peak, running)
    return peak / MiB


def _is_oom(err: BaseException) -> bool:
    if isinstance(err, torch.cuda.OutOfMemoryError | MemoryError):
        return True
    text = str(err).lower()
    return "out of memory" in text or "can't allocate memory" in text


def _free(device: str) -> None:
    if device == "cuda":
        torch.cuda.empty_cache()


def _fused_sweep_status(device: str) -> str:
    """Whether the Triton rejection sweep ran (CUDA) or the PyTorch one."""
    if device != "cuda":
        return "pytorch (not CUDA)"
    if triton_sweep.triton is None:
        return "pytorch (Triton not importable)"
    if triton_sweep._broken:
        return "pytorch (Triton sweep failed or disagreed; see warnings)"
    return "triton" if triton_sweep.available() else "pytorch (disabled)"


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    threads = torch.get_num_threads()
    cpu = platform.processor() or platform.machine()
    return f"{cpu} CPU, {threads} thread{'s' * (threads != 1)}"


def _inputs(config: ScalingConfig, n: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device=config.device).manual_seed(config.seed + n)
    shape = (1, config.batch_heads, n, config.head_dim)
    dtype = DTYPES[config.dtype]
    return tuple(
        torch.randn(shape, generator=gen, device=config.device).to(dtype) for _ in range(4)
    )  # q, k, v and the backward cotangent


# --max-seconds bounds each measurement by its predicted time: from the arm's last length
# (or a one-call probe at this length, at most) scaled by n ** exponent
PROBE_LENGTH = 1024


def _exponent(method: str) -> int:
    """How an arm's time grows with n: exact attention quadratically, the others about
    linearly (landmarks of a fixed rank)."""
    return 2 if method == "exact" else 1


def _calls(kind: str, config: ScalingConfig, repeats: int) -> int:
    """Calls of the attention one measurement makes."""
    if kind == "memory":
        return 1 + int(config.backward)
    return config.warmup + repeats


def _per_call_s(
    history: Mapping[tuple[str, int | None, str], tuple[int, float]],
    key: tuple[str, int | None, str],
    n: int,
    method: str,
) -> float | None:
    """The predicted seconds of one call at ``n`` from the arm's last measured length."""
    if key not in history:
        return None
    n0, seconds = history[key]
    return seconds * (n / n0) ** _exponent(method)


def _probe_s(kind: str, attn: torch.nn.Module, config: ScalingConfig, n: int, method: str) -> float:
    """Seconds of one call at ``n`` predicted from one call at ``PROBE_LENGTH`` (0 where
    ``n`` is no longer: short lengths are cheap, and the budget is checked between)."""
    if n <= PROBE_LENGTH:
        return 0.0
    probe = _inputs(config, PROBE_LENGTH)
    started = time.perf_counter()
    try:
        _measure(kind, attn, probe, replace(config, warmup=0), 1)
    except Exception:  # noqa: BLE001 - the measurement itself will record the error
        return 0.0
    calls = _calls(kind, replace(config, warmup=0), 1)
    per_call = (time.perf_counter() - started) / calls
    return per_call * (n / PROBE_LENGTH) ** _exponent(method)


def _measure(
    kind: str, attn: torch.nn.Module, inputs: tuple, config: ScalingConfig, repeats: int
) -> dict:
    """One measurement of one arm at one length -> the row fields it fills."""
    q, k, v, cotangent = inputs
    device = config.device
    if kind == "forward":

        def call() -> None:
            with torch.no_grad():
                attn(q, k, v)

        times = time_call(call, device, config.warmup, repeats)
        return {"forward_ms": statistics.median(times), "forward_ms_all": times}
    if kind == "pivot":  # the accelerated selection alone (RPKA-like methods)
        if not hasattr(attn, "select") or getattr(attn, "method", None) != "accelerated":
            return {}

        def call() -> object:
            with torch.no_grad():
                return attn.select(attn.point_set(q, k))

        times = time_call(call, device, config.warmup, repeats)
        state = call()
        return {
            "pivot_ms": statistics.median(times),
            "pivot_ms_all": times,
            "rounds": state.rounds,
            "candidates": state.candidates,
            "refreshes": state.refreshes,
        }
    if kind == "memory":
        fields = {}
        with torch.no_grad():
            fields["peak_mib"] = peak_memory_mib(lambda: attn(q, k, v), device)
        if config.backward:
            leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
            fields["fwd_bwd_peak_mib"] = peak_memory_mib(
                lambda: torch.autograd.grad(attn(*leaves), leaves, cotangent), device
            )
        return fields
    leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
    times = time_call(
        lambda: torch.autograd.grad(attn(*leaves), leaves, cotangent),
        device,
        config.warmup,
        repeats,
    )
    return {"fwd_bwd_ms": statistics.median(times), "fwd_bwd_ms_all": times}


def _interleave_forward(
    config: ScalingConfig, inputs: tuple, repeats: int, rows: dict, n: int
) -> None:
    """CPU: time again the forward of every arm whose own measurement succeeded at this
    length n, each in turn within every repeat (a burst of load hits every arm alike), and
    make those medians the row's ``forward_ms`` (wall) and ``forward_cpu_ms`` (process CPU
    time); the arm-by-arm median stays as ``forward_ms_alone``. Not on a GPU (CUDA events
    time each arm alone) nor under a time budget (its skips are per arm)."""
    if config.device != "cpu" or config.max_seconds is not None:
        return
    q, k, v, _ = inputs
    here = {key: row for key, row in rows.items() if key[2] == n}
    ok = {key: row for key, row in here.items() if row.get("forward_status") == "ok"}
    spec = {(label, rank): (method, opts) for label, rank, method, opts in arms(config)}
    modules = {key: build(spec[key[:2]][0], **spec[key[:2]][1]) for key in ok}

    def call(attn: torch.nn.Module) -> Callable[[], object]:
        def run() -> object:
            with torch.no_grad():
                return attn(q, k, v)

        return run

    times = interleaved({key: call(m) for key, m in modules.items()}, config.warmup, repeats)
    for key, t in times.items():
        ok[key]["forward_ms_alone"] = ok[key]["forward_ms"]
        ok[key] |= {
            "forward_ms": statistics.median(t["wall_ms"]),
            "forward_ms_all": t["wall_ms"],
            "forward_cpu_ms": statistics.median(t["cpu_ms"]),
            "forward_cpu_ms_all": t["cpu_ms"],
            "forward_interleaved": True,
        }


def _add_ratios(rows: list[dict]) -> None:
    """Ratios against exact at the same length, within this run."""
    exact = {r["n"]: r for r in rows if r["method"] == "exact"}
    for row in rows:
        ref = exact.get(row["n"], {})
        for key, field_, inverse in (
            ("speedup_vs_exact", "forward_ms", True),
            ("speedup_cpu_vs_exact", "forward_cpu_ms", True),  # CPU time (interleaved, CPU)
            ("fwd_bwd_speedup_vs_exact", "fwd_bwd_ms", True),
            ("memory_vs_exact", "peak_mib", False),
            ("fwd_bwd_memory_vs_exact", "fwd_bwd_peak_mib", False),
        ):
            mine, theirs = row.get(field_), ref.get(field_)
            ok = isinstance(mine, float) and isinstance(theirs, float) and mine > 0 and theirs > 0
            row[key] = (theirs / mine if inverse else mine / theirs) if ok else None
        if isinstance(row.get("pivot_ms"), float) and isinstance(row.get("forward_ms"), float):
            row["pivot_fraction"] = row["pivot_ms"] / row["forward_ms"]


def config_record(config: ScalingConfig) -> dict:
    """``config`` as a scaling result stores it (``"config"``): JSON values only."""
    return (
        asdict(config)
        | {k: list(getattr(config, k)) for k in ("lengths", "ranks", "control_ranks")}
        | {"extra_arms": [dict(arm) for arm in config.extra_arms]}
    )


def _header(config: ScalingConfig, preset: str | None) -> dict:
    return {
        "preset": preset,
        "config": config_record(config),
        "device": device_name(config.device),
        "device_type": config.device,
        "dtype": config.dtype,
        "rpka_compute_dtype": "float64" if config.dtype == "float64" else "float32",
        "shapes": (
            f"q, k, v: (B=1, H={config.batch_heads}, n, d={config.head_dim}), {config.dtype}; "
            f"B*H = {config.batch_heads}"
        ),
        "exact": f"torch SDPA, backend {config.exact_backend or 'auto'}",
        "control": f"{CONTROL}: rpka with pivot_rule='uniform' (uniform landmarks)",
        "rpka_options": "defaults of RPKAttention (pivot_method auto -> accelerated)",
        "check_inputs": True,  # every arm with its default options (issue 39)
        "timing": (
            "CUDA events after warm-up, median"
            if config.device == "cuda"
            else "time.perf_counter after warm-up, median; forward: arms interleaved "
            "within each repeat, wall (forward_ms) and process CPU time (forward_cpu_ms)"
        ),
        "memory_definition": (
            "max_memory_allocated during one call minus memory_allocated just before it"
            if config.device == "cuda"
            else "peak of torch.profiler tensor allocations during one call, op granularity "
            "(PyTorch tensors only; transient buffers inside one op are missed)"
        ),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "threads": torch.get_num_threads(),
        "numerics": numerics.record(),  # pinned or native kernels (rpka.numerics)
        "load_average_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "rows": [],
    }


def run_scaling(
    config: ScalingConfig,
    progress: bool = True,
    out: str | os.PathLike | None = None,
    preset: str | None = None,
) -> dict:
    """Measure every arm at every length; write ``out`` after each measurement.

    The forward measures (forward, pivot selection, memory) of all lengths come first and
    forward + backward last, so a time budget cuts the least important part.
    """
    config.validate()
    result = _header(config, preset)
    started = time.perf_counter()
    rows = {
        (label, rank, int(n)): {"method": label, "rank": rank, "n": int(n)}
        for n in config.lengths
        for label, rank, _, _ in arms(config)
    }
    result["rows"] = list(rows.values())
    # "oom" in a measurement of an arm skips that measurement at larger n
    failed: set[tuple[str, int | None, str]] = set()
    phases = [["forward", "pivot"] + (["memory"] if config.memory else [])]
    phases += [["fwd_bwd"]] if config.backward else []
    jobs = [(kinds, int(n)) for kinds in phases for n in config.lengths]
    bar = _progress(len(jobs) * len(arms(config)), progress)
    history: dict[tuple[str, int | None, str], tuple[int, float]] = {}  # last n, s per call
    for kinds, n in jobs:
        inputs = _inputs(config, n)
        repeats = config.long_repeats if n >= config.long_length else config.repeats
        for label, rank, method, options in arms(config):
            row = rows[(label, rank, n)]
            attn = build(method, **options)  # the options a user gets: input check on
            for kind in kinds:
                if kind == "pivot" and method == "exact":
                    continue
                over = config.max_seconds and time.perf_counter() - started > config.max_seconds
                if over or (label, rank, kind) in failed:
                    row[f"{kind}_status"] = "skipped"
                    continue
                calls = _calls(kind, config, repeats)
                if config.max_seconds:  # a single measurement must fit what is left too
                    left = config.max_seconds - (time.perf_counter() - started)
                    per_call = _per_call_s(history, (label, rank, kind), n, method)
                    if per_call is None:
                        per_call = _probe_s(kind, attn, config, n, method)
                    if per_call * calls > left:
                        row[f"{kind}_status"] = "skipped"
                        row[f"{kind}_predicted_s"] = per_call * calls
                        continue
                try:
                    measured = time.perf_counter()
                    row.update(_measure(kind, attn, inputs, config, repeats))
                    history[(label, rank, kind)] = (n, (time.perf_counter() - measured) / calls)
                    row[f"{kind}_status"] = "ok"
                except Exception as err:  # noqa: BLE001 - recorded, the sweep goes on
                    oom = _is_oom(err)
                    row[f"{kind}_status"] = "oom" if oom else f"error: {err!r}"[:300]
                    failed.add((label, rank, kind))
                _free(config.device)
            bar.update(1)
            bar.set_postfix(n=n, arm=f"{label}{'' if rank is None else rank}", refresh=False)
            _add_ratios(result["rows"])
            result["elapsed_s"] = time.perf_counter() - started
            if out is not None:
                write_result_json(out, result)
        if "forward" in kinds:  # every arm's forward again, interleaved (CPU)
            _interleave_forward(config, inputs, repeats, rows, n)
            _add_ratios(result["rows"])
        del inputs
        _free(config.device)
    bar.close()
    result["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    loads = [x[0] for x in (result["load_average_start"], result["load_average_end"]) if x]
    if loads and max(loads) > result["threads"]:  # contended: the report should say so
        result["load_warning"] = f"load average {max(loads):.2f} > {result['threads']} threads"
    result["fused_sweep"] = _fused_sweep_status(config.device)
    if out is not None:
        write_result_json(out, result)
    return result


def forward_latency(result: Mapping[str, Any], length: int | None = None) -> dict[str, float]:
    """``{arm label: forward_ms}`` of a scaling result at ``length`` (default: its longest).

    Labels are the methods' (``exact``, extra arms by name); rank-swept arms (``rpka``,
    ``nystrom-uniform``) are labelled ``<method>-r<rank>``. Failed measurements are left out.
    """
    lengths = [row["n"] for row in result["rows"]]
    length = max(lengths) if length is None else length
    out = {}
    for row in result["rows"]:
        if row["n"] != length or not isinstance(row.get("forward_ms"), float):
            continue
        extra = row["method"] not in ("exact", "rpka", CONTROL)
        label = row["method"] if extra or row["rank"] is None else f"{row['method']}-r{row['rank']}"
        out[label] = row["forward_ms"]
    return out


class _NoBar:
    def update(self, *_: object) -> None: ...
    def set_postfix(self, **_: object) -> None: ...
    def close(self) -> None: ...


def _progress(total: int, enabled: bool) -> object:
    if tqdm is None:
        return _NoBar()
    return tqdm(total=total, desc="scaling", disable=not enabled)


def summary_lines(result: dict) -> list[str]:
    """A plain-text table of the forward figures."""
    lines = [
        f"{'method':>16} {'rank':>5} {'n':>6} {'fwd ms':>9} {'vs exact':>9} {'pivot %':>8} "
        f"{'peak MiB':>9} {'fwd+bwd ms':>11}"
    ]
    for r in result["rows"]:

        def fmt(value: object, spec: str) -> str:
            return format(value, spec) if isinstance(value, float) else "-"

        pivot = r.get("pivot_fraction")
        lines.append(
            f"{r['method']:>16} {r['rank'] or '-':>5} {r['n']:>6} "
            f"{fmt(r.get('forward_ms'), '9.2f'):>9} {fmt(r.get('speedup_vs_exact'), '8.2f'):>9} "
            f"{fmt(None if pivot is None else 100 * pivot, '7.1f'):>8} "
            f"{fmt(r.get('peak_mib'), '9.1f'):>9} {fmt(r.get('fwd_bwd_ms'), '10.2f'):>11}"
        )
    lines.append(f"device: {result['device']}; {result['shapes']}")
    return lines
