"""Autoregressive decoding latency per token against context length (docs/design.md section 7).

For each context length n: prefill n tokens, take ``warmup`` steps, then time ``steps``
single-token steps one by one - ``exact`` with a KV cache (SDPA over every cached key,
O(n d) per token) against causal ``rpka`` (running landmark sums, O(r d + b d) per token).
The timed steps cross one block boundary, so the per-block fold is inside them; landmark
redraws happen when the context doubles, so none falls in the timed steps - their cost is
reported separately (``redraw_ms``, the median of ``REDRAW_REPEATS``; amortised, it is
``redraw_ms / n`` per token).

The target is a ratio between contexts, so every context of a method is prefilled first and
their steps are then timed in turn: each round takes one step of every context, in a fresh
seeded order, and a busy minute of a shared machine falls on all contexts alike (timed one
context after another, three runs of the same code read 0.70, 1.06 and 1.41, issue 55).
CPU timing is the process's CPU time (``time.process_time``: another tenant's load does not
count), CUDA timing CUDA events after warm-up. One JSON file, with the device, dtype and
shapes stated.

    python -m rpka decode --contexts 1024 4096 16384 --out /tmp/decode.json

The committed ``data/results/scaling/decode_cpu.json`` (4 minutes, one thread) is this
command with ``--out`` set to that path::

    python -m rpka decode --contexts 1024 2048 4096 8192 16384 32768 65536
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from typing import Any, ClassVar

import torch
from tqdm.auto import tqdm

from rpka.attention import build
from rpka.attention.causal import LandmarkSet, sampler_of
from rpka.checks import require_memory
from rpka.speed.scaling import DTYPES, device_name


@dataclass
class DecodeConfig:
    """One decoding sweep: every method at every context length."""

    # the sweep's comparison, exact with a KV cache against causal RPKA: this benchmark's
    # design (build_method builds these two), not metadata of the methods; a class
    # constant, not a field, so the result's "config" keeps its keys
    methods: ClassVar[tuple[str, ...]] = ("exact", "rpka")

    contexts: Sequence[int] = (1024, 2048, 4096, 8192, 16384)
    batch_heads: int = 16
    head_dim: int = 64
    rank: int = 64
    block_size: int = 64
    pivot_set: str = "joint"
    device: str = "cpu"
    dtype: str = "float32"
    warmup: int = 4
    steps: int = 64
    seed: int = 0
    target_ratio: float = 1.2  # issue 7: rpka per token at the longest context <= 1.2 x at 1k

    def validate(self) -> None:
        if not self.contexts or any(int(n) < 1 for n in self.contexts):
            raise ValueError(f"contexts must be positive integers, got {list(self.contexts)}")
        for name, value, low in (
            ("batch_heads", self.batch_heads, 1),
            ("head_dim", self.head_dim, 1),
            ("rank", self.rank, 1),
            ("block_size", self.block_size, 1),
            ("warmup", self.warmup, 0),
            ("steps", self.steps, 1),
        ):
            if int(value) < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        short = [int(n) for n in self.contexts if int(n) < int(self.block_size)]
        if short:  # no full block yet: no landmarks, nothing for RPKA's redraw to time
            raise ValueError(
                f"contexts must be >= block_size {self.block_size} (RPKA's landmarks come "
                f"from full blocks), got {short}"
            )
        if self.pivot_set not in ("joint", "keys"):
            raise ValueError(f"pivot_set must be 'joint' or 'keys', got {self.pivot_set!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' requested but CUDA is not available")
        if not self.target_ratio > 0:
            raise ValueError(f"target_ratio must be > 0, got {self.target_ratio}")
        require_memory(
            "contexts", max(int(n) for n in self.contexts), self.memory_bytes(),
            "q, k, v of the longest context and both methods' caches",
        )  # fmt: skip

    def sequence_length(self) -> int:
        """Tokens of q, k, v the sweep draws: the longest context or the untimed warm-up
        run (two blocks), whichever is longer, then its warm-up and timed steps."""
        longest = max(max(int(n) for n in self.contexts), 2 * int(self.block_size))
        return longest + int(self.warmup) + int(self.steps)

    def memory_bytes(self) -> float:
        """A lower estimate of the sweep's peak memory: q, k, v (3 tensors) and, for one
        method at a time, the states of every context at once (RPKA's: k, v and the
        queries, more than the exact cache's k, v)."""
        item = torch.empty((), dtype=DTYPES[self.dtype]).element_size()
        positions = 3 * self.sequence_length() + 3 * sum(
            int(n) + self.warmup + self.steps for n in self.contexts
        )
        return float(self.batch_heads * self.head_dim * item * positions)


def timed(fn: Callable[[], Any], device: str) -> tuple[Any, float]:
    """``fn()`` and its time in milliseconds: CUDA events on a GPU, the process's CPU time
    on the CPU."""
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        result = fn()
        end.record()
        torch.cuda.synchronize()
        return result, start.elapsed_time(end)
    t0 = time.process_time()
    result = fn()
    return result, (time.process_time() - t0) * 1e3


def build_method(name: str, config: DecodeConfig) -> torch.nn.Module:
    if name == "exact":
        return build("exact", causal=True, check_inputs=False)
    generator = torch.Generator(device=config.device).manual_seed(config.seed)
    return build(
        "rpka",
        causal=True,
        check_inputs=False,
        rank=config.rank,
        causal_block=config.block_size,
        pivot_set=config.pivot_set,
        generator=generator,
    )


# Redraws timed per context (median): one redraw at 1,024 tokens is ~0.1 s, so one reading
# carries a busy moment whole into the amortised per-token cost.
REDRAW_REPEATS = 3


def decode_contexts(
    name: str, config: DecodeConfig, qkv: list[torch.Tensor], progress: bool = False
) -> list[dict]:
    """Prefill every context of one method, then time their single steps in turn (one step
    of each context per round, in a fresh seeded order); one result row per context.
    ``progress``: a bar over the prefills (exact's at 65,536 tokens takes minutes)."""
    contexts = [int(n) for n in config.contexts]
    attns, states, rows = {}, {}, {}
    for n in tqdm(contexts, desc=f"{name}: prefill", disable=not progress):
        attns[n] = attn = build_method(name, config).to(config.device)
        if config.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        prompt = [x[..., :n, :] for x in qkv]
        prefill_call = partial(attn.prefill, *prompt, capacity=n + config.warmup + config.steps)
        (_, states[n]), prefill = timed(prefill_call, config.device)
        rows[n] = {
            "method": name,
            "context": n,
            "prefill_ms": prefill,
            # CUDA only: the prefill's peak memory beyond what was allocated before it
            "peak_mib": (torch.cuda.max_memory_allocated() - before) / 2**20
            if config.device == "cuda"
            else None,
        }
    times: dict[int, list[float]] = {n: [] for n in contexts}
    order = random.Random(config.seed)
    for i in range(config.warmup + config.steps):
        for n in order.sample(contexts, len(contexts)):
            token = [x[..., n + i : n + i + 1, :] for x in qkv]
            (_, states[n]), ms = timed(
                lambda n=n, token=token: attns[n].step(*token, states[n]), config.device
            )
            if i >= config.warmup:
                times[n].append(ms)
    for n in contexts:
        rows[n] |= {
            "per_token_ms": statistics.median(times[n]),
            "per_token_mean_ms": statistics.fmean(times[n]),
            "per_token_max_ms": max(times[n]),
            "per_token_ms_all": times[n],
        }
    if name == "rpka":
        redraws: dict[int, list[float]] = {n: [] for n in contexts}
        for _ in range(REDRAW_REPEATS):
            for n in order.sample(contexts, len(contexts)):
                redraws[n].append(redraw_ms(attns[n], states[n], config.device))
        for n in contexts:
            rows[n]["redraw_ms"] = statistics.median(redraws[n])
            rows[n]["redraw_ms_all"] = redraws[n]
            rows[n]["amortised_redraw_ms_per_token"] = rows[n]["redraw_ms"] / n
            rows[n]["guard_counts"] = attns[n].guard_counts
    return [rows[n] for n in contexts]


@torch.no_grad()
def redraw_ms(attn: torch.nn.Module, state: Any, device: str) -> float:
    """Time of one landmark redraw (RPCholesky + moments) over the state's whole context."""
    queries = state.queries.view() if state.queries is not None else None
    keys = state.keys.view() - state.centre
    values = state.values.view()

    def redraw() -> None:
        LandmarkSet.draw(sampler_of(attn), queries, keys).moments(keys, values)

    return timed(redraw, device)[1]


def run_decoding(config: DecodeConfig, progress: bool = True) -> dict:
    """Per-token decode latency of each method at each context length."""
    config.validate()
    load_start = os.getloadavg()  # CPU timings mean little on a busy machine: record it
    dtype = DTYPES[config.dtype]
    gen = torch.Generator(device=config.device).manual_seed(config.seed)
    # the warm-up run prefills two blocks: with a shorter context (--contexts 8 --rank 64,
    # --contexts 24 --block-size 16) its steps read past q, k, v ("step takes one token")
    shape = (1, config.batch_heads, config.sequence_length(), config.head_dim)
    qkv = [torch.randn(shape, generator=gen, device=config.device).to(dtype) for _ in range(3)]
    warm = replace(config, contexts=[2 * config.block_size])
    for name in config.methods:  # untimed: lazy init, kernels
        decode_contexts(name, warm, qkv)
    rows = []
    for name in config.methods:
        rows += decode_contexts(name, config, qkv, progress)
    return {
        "config": asdict(config) | {"contexts": [int(n) for n in config.contexts]},
        "device": device_name(config.device),
        "torch": torch.__version__,
        "dtype": config.dtype,
        "shape": (
            f"B=1, H={config.batch_heads}, d={config.head_dim}, {config.dtype} inputs; rpka "
            f"rank={config.rank}, block_size={config.block_size}, pivot_set={config.pivot_set}, "
            "computing in float32"
        ),
        "host_loadavg_1_5_15min": {"start": load_start, "end": os.getloadavg()},
        "rows": rows,
        "summary": summarise(rows, config.target_ratio),
    }


def summarise(rows: list[dict], target_ratio: float) -> dict:
    """Per method: median ms per token by context, growth longest/shortest, vs exact."""
    summary: dict[str, Any] = {}
    for name in DecodeConfig.methods:
        by_n = {r["context"]: r["per_token_ms"] for r in rows if r["method"] == name}
        shortest, longest = min(by_n), max(by_n)
        summary[name] = {
            "per_token_ms": {str(n): ms for n, ms in sorted(by_n.items())},
            "growth_longest_vs_shortest": by_n[longest] / by_n[shortest],
        }
    exact = summary["exact"]["per_token_ms"]
    summary["rpka"]["speedup_vs_exact"] = {
        n: exact[n] / ms for n, ms in summary["rpka"]["per_token_ms"].items()
    }
    growth = summary["rpka"]["growth_longest_vs_shortest"]
    redrawn = {
        r["context"]: r["per_token_ms"] + r["amortised_redraw_ms_per_token"]
        for r in rows
        if r["method"] == "rpka"
    }
    with_redraw = redrawn[max(redrawn)] / redrawn[min(redrawn)]
    summary["target"] = {
        "statement": f"rpka per-token time at the longest context <= {target_ratio} x at the "
        "shortest, with and without the landmark redraw amortised over the tokens it serves",
        "ratio": growth,
        "ratio_with_redraw": with_redraw,
        "met": max(growth, with_redraw) <= target_ratio,
    }
    return summary
