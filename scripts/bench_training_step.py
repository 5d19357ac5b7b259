"""Model training step: time and peak memory of exact attention against RPKA (issue 16).

One training step of the study's stacked model (``rpka.model.TransformerTiny``): forward
on S members x B windows, the summed per-member MSE, backward, one Adam update, gradients
freed - the step ``rpka.study.longctx.training_step_peak_mib`` probes. Two shapes:

* ``forecast``: the main study's model (``ModelConfig()``: d_model 32, 2 layers, 2 heads)
  at 96 tokens, 8 members x batch 32 (the bench's evaluation job);
* ``longctx``: the long-context study's model (d_model 16, 1 layer, 1 head, no linear
  skip) at 512 / 2,048 / 8,192 tokens, 4 members x batch 16;
* ``lm``: the lm track's causal decoder (``rpka.config.presets.LM_MODEL``, ``TransformerLM``) at
  64 tokens, 8 members x batch 32, cross-entropy over the tokens; RPKA arms run causal
  with the track's block (``LM_CAUSAL_BLOCK``).

Arms: exact (torch SDPA), rpka-r16, rpka-r64 with the accelerated (block + rejection)
pivot selection (the default, ``pivot_method="auto"``) and with the plain one-pivot loop;
``*-torch`` arms run the plain loop op by op in PyTorch (``pivot_backend="torch"``, the
reference) instead of compiled (the default, issue 28).

* ``step_ms``: median wall time of ``--repeats`` steps after ``--warmup`` steps
  (``time.perf_counter``; the arms of a shape take turns, one step each per repeat), and
  the quartiles; ``step_cpu_ms``: the median CPU time of the same steps
  (``time.process_time``). On a shared, loaded machine the wall time includes waiting for
  a core; with one thread (``OMP_NUM_THREADS=1``) the CPU time is close to
  the step's time on an idle core, so the ratios are taken of it;
* ``peak_mib``: peak memory of one step above what was held before it (weights, Adam
  state, batch), ``rpka.speed.scaling.peak_memory_mib``: on the CPU the running sum of the tensor
  allocations ``torch.profiler`` records - PyTorch tensors only, a lower bound of RSS.

The machine's load average is recorded before and after: on a shared machine the times
are noisy, the ratios within one shape less so (every arm runs in the same process).

    python scripts/bench_training_step.py           # -> data/results/scaling/training_step_cpu.json
    python scripts/bench_training_step.py --tiny    # seconds: a smoke run of the same code
    python scripts/bench_training_step.py --device cuda --contexts 2048 8192 \
        --output data/results/scaling/training_step_cuda.json     # on a GPU (gpu_all.sh)

On a GPU ``step_cpu_ms`` is the host's CPU time (launching kernels, the pivot loop's host
synchronisations) and ``step_ms`` the step's wall time after a synchronisation: compare
the arms by ``step_wall_vs_exact`` there.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from rpka import paths
from rpka.config.presets import LM_CAUSAL_BLOCK, LM_MODEL, LM_TRACK
from rpka.io import write_json
from rpka.model import ModelConfig, TransformerLM, TransformerTiny
from rpka.speed.scaling import peak_memory_mib

DEFAULT_OUTPUT = f"{paths.SCALING_RESULTS}/training_step_cpu.json"
HORIZON = 24  # the forecast track's horizon (rpka.tracks.forecast.TrackConfig)
TORCH_LOOP = {"pivot_backend": "torch"}
ARMS: dict[str, tuple[str, dict[str, Any]]] = {
    "exact": ("exact", {}),
    "rpka-r16": ("rpka", {"rank": 16}),
    "rpka-r64": ("rpka", {"rank": 64}),  # pivot_method="auto": accelerated
    "rpka-r64-plain": ("rpka", {"rank": 64, "pivot_method": "plain"}),
    "rpka-r32": ("rpka", {"rank": 32}),  # causal (lm): the plain loop on each draw block
    # the plain loop op by op in PyTorch (the reference; before issue 28's compiled loop)
    "rpka-r64-plain-torch": (
        "rpka",
        {"rank": 64, "pivot_method": "plain", "pivot_backend": "torch"},
    ),
    "rpka-r16-plain": ("rpka", {"rank": 16, "pivot_method": "plain"}),
    "rpka-r16-plain-torch": (
        "rpka",
        {"rank": 16, "pivot_method": "plain", "pivot_backend": "torch"},
    ),
    "rpka-r32-torch": ("rpka", {"rank": 32, **TORCH_LOOP}),
    # opt-in: the proposal refresh by L^{-1} and matrix products (same law, not bitwise)
    "rpka-r64-inverse": ("rpka", {"rank": 64, "residual_solve": "inverse"}),
    # the reference differentiable path (nystrom_softmax under autograd), before issue 16
    "rpka-r64-autograd": ("rpka", {"rank": 64, "grad_path": "autograd"}),
}
# the long-context study's model (rpka.config.presets._LONGCTX_MODEL)
LONGCTX_MODEL = ModelConfig(
    d_model=16, n_layers=1, n_heads=1, d_ff=32, head_init_std=0.0, linear_skip=False
)


@dataclass(frozen=True)
class Shape:
    """One training shape: ``members`` x ``batch`` windows of ``context`` tokens."""

    name: str
    model: ModelConfig
    context: int
    members: int
    batch: int

    @property
    def causal(self) -> bool:
        """The lm shape trains a causal decoder on tokens; the others forecast."""
        return self.name == "lm"


def shapes(tiny: bool) -> list[Shape]:
    if tiny:
        small = ModelConfig(d_model=8, n_layers=1, n_heads=1, d_ff=16)
        small_lm = ModelConfig(
            d_model=8, n_layers=1, n_heads=1, d_ff=16, embed_kernel=1, linear_skip=False
        )
        return [
            Shape("forecast", small, 24, 2, 4),
            Shape("longctx", small, 80, 2, 2),
            Shape("lm", small_lm, 40, 2, 2),
        ]
    return [
        Shape("forecast", ModelConfig(), 96, 8, 32),
        *(Shape("longctx", LONGCTX_MODEL, n, 4, 16) for n in (512, 2048, 8192)),
        Shape("lm", LM_MODEL, LM_TRACK.seq_len - 1, 8, 32),
    ]


def training_step(
    shape: Shape, method: str, options: dict[str, Any], seed: int = 0, device: str = "cpu"
):
    """A closure running one Adam training step of a fresh stacked model on random data."""
    seeds = list(range(shape.members))
    options = dict(options)
    if method == "rpka":
        options["generator"] = torch.Generator(device).manual_seed(seed)
    data = torch.Generator().manual_seed(seed)
    size = (shape.members, shape.batch, shape.context)
    if shape.causal:
        if method == "rpka":
            options["causal_block"] = LM_CAUSAL_BLOCK
        n_tokens = LM_TRACK.n_tokens
        model = TransformerLM(shape.model, n_tokens, shape.context, seeds, method, options)
        x = torch.randint(n_tokens, size, generator=data).to(device)
        y = torch.randint(n_tokens, size, generator=data).to(device)
    else:
        model = TransformerTiny(shape.model, shape.context, HORIZON, seeds, method, options)
        x = torch.randn(size, generator=data).to(device)
        y = torch.randn(shape.members, shape.batch, HORIZON, generator=data).to(device)
    model = model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    def loss_of() -> torch.Tensor:
        """The summed per-member loss (each member's gradient is its own)."""
        out = model(x)
        if shape.causal:  # (S, B, n, V) logits against (S, B, n) tokens
            nll = F.cross_entropy(out.flatten(0, 2), y.flatten(), reduction="none")
            return nll.view(size).mean((1, 2)).sum()
        return (out - y).pow(2).mean((1, 2)).sum()

    def step() -> None:
        loss = loss_of()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


# steps of 8,192 tokens take tens of seconds for exact attention: fewer repeats there
LONG_CONTEXT, LONG_REPEATS = 8192, 2


def _sync(device: str) -> None:
    if device == "cuda":  # a step's kernels are queued: wait for them before reading a clock
        torch.cuda.synchronize()


def measure(
    shape: Shape, arms: list[str], warmup: int, repeats: int, device: str = "cpu"
) -> list[dict[str, Any]]:
    """Time every arm at one shape, the arms' steps interleaved (round robin).

    Interleaving keeps a drift of the machine (another job, frequency, allocator state)
    from landing on one arm: run one arm after the other and exact's median moved by
    15-20 % between runs of the same code (1.76x and 2.25x for rpka-r16 at 96 tokens).
    """
    if shape.context >= LONG_CONTEXT:
        repeats = min(repeats, LONG_REPEATS)
    steps = {arm: training_step(shape, *ARMS[arm], device=device) for arm in arms}
    for step in steps.values():
        for _ in range(warmup):
            step()
    times: dict[str, list[float]] = {arm: [] for arm in arms}
    cpu_times: dict[str, list[float]] = {arm: [] for arm in arms}
    for _ in range(repeats):
        for arm, step in steps.items():
            _sync(device)
            wall, cpu = time.perf_counter(), time.process_time()
            step()
            _sync(device)
            cpu_times[arm].append((time.process_time() - cpu) * 1e3)
            times[arm].append((time.perf_counter() - wall) * 1e3)
    rows = []
    for arm, step in steps.items():
        method, options = ARMS[arm]
        arm_times = times[arm]
        q1, _, q3 = statistics.quantiles(arm_times, n=4) if repeats > 1 else arm_times * 3
        rows.append(
            {
                "shape": shape.name,
                "context": shape.context,
                "arm": arm,
                "method": method,
                "options": options,
                "step_ms": statistics.median(arm_times),
                "step_ms_q1": q1,
                "step_ms_q3": q3,
                "step_cpu_ms": statistics.median(cpu_times[arm]),
                "step_cpu_ms_all": cpu_times[arm],
                "repeats": repeats,
                "peak_mib": peak_memory_mib(step, device),
            }
        )
    return rows


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """``*_vs_exact``: each arm's median step CPU time, wall time and peak against exact at
    its shape."""
    exact = {(r["shape"], r["context"]): r for r in rows if r["arm"] == "exact"}
    for row in rows:
        base = exact.get((row["shape"], row["context"]))
        if base:
            row["step_cpu_vs_exact"] = row["step_cpu_ms"] / base["step_cpu_ms"]
            row["step_wall_vs_exact"] = row["step_ms"] / base["step_ms"]
            row["peak_vs_exact"] = row["peak_mib"] / base["peak_mib"] if base["peak_mib"] else None


def run(
    tiny: bool,
    repeats: int,
    warmup: int,
    arms: list[str],
    contexts: list[int] | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    load_before = os.getloadavg()
    rows = []
    for shape in shapes(tiny):
        if contexts and shape.context not in contexts:
            continue
        for row in measure(shape, arms, warmup, repeats, device):
            rows.append(row)
            print(
                f"{shape.name:8s} n={shape.context:5d} {row['arm']:15s} "
                f"cpu {row['step_cpu_ms']:9.1f} ms  wall {row['step_ms']:9.1f} ms  "
                f"{row['peak_mib']:8.1f} MiB",
                flush=True,
            )
    add_ratios(rows)
    return {
        "what": "one Adam training step of TransformerTiny (forward, summed MSE, backward, "
        "update), median wall time; peak memory above the state held before the step",
        "memory_definition": "rpka.speed.scaling.peak_memory_mib: "
        + (
            "torch.cuda.max_memory_allocated above the memory allocated before the step"
            if device == "cuda"
            else "running sum of tensor allocations recorded by torch.profiler (CPU), a "
            "lower bound of RSS"
        ),
        "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor(),
        "device_type": device,
        "tiny": tiny,
        "warmup": warmup,
        "order": "interleaved: each repeat runs one step of every arm at the shape",
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "shapes": {
            s.name: {"model": vars(s.model), "members": s.members, "batch": s.batch}
            for s in shapes(tiny)
        },
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes: runs in seconds")
    parser.add_argument(
        "--repeats", type=int, default=None, help="timed steps (default 5; 2 at 8,192 tokens)"
    )
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps (default 1)")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument(
        "--contexts", nargs="+", type=int, default=None, help="only these token counts"
    )
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="where the steps run"
    )
    parser.add_argument("--output", default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available here")
    repeats = args.repeats if args.repeats is not None else (1 if args.tiny else 5)
    warmup = args.warmup if args.warmup is not None else (0 if args.tiny else 1)
    if repeats < 1 or warmup < 0:
        parser.error(f"--repeats must be >= 1 and --warmup >= 0, got {repeats}, {warmup}")
    t0 = time.perf_counter()
    result = run(args.tiny, repeats, warmup, args.arms, args.contexts, args.device)
    result["wall_s"] = time.perf_counter() - t0
    write_json(args.output, result)
    print(f"wrote {args.output} ({result['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
