"""Causal RPKA against exact causal attention (issue 55): the benchmark that writes JSON.

The measurements, one thread by default, arms interleaved in a fresh seeded order every
repeat (:func:`rpka.speed.timing.interleaved`), CPU time (``time.process_time``) beside
wall time, medians of ``repeats`` >= 7 after ``warmup`` calls:

* ``forward``: causal RPKA at each rank vs ``F.scaled_dot_product_attention(...,
  is_causal=True)`` on q, k, v (1, 8, n, 64) float32, no gradients, at each length, with
  the FLOP-ideal speed-up (:func:`flop_ideal_speedup`) and measured / ideal;
* ``forward_sharp``: the forward at one length and rank with q scaled so that the logits'
  std is ``--sharp-std`` (3) instead of 1, as in trained models;
* ``forward_backward``: the same at one length and rank, forward + backward of
  ``out.sum()``;
* ``peak_memory``: one causal forward's peak (``rpka.speed.scaling.peak_memory_mib``);
  ``peak_memory_train``: one forward + backward's;
* ``decoder``: a GPT-2-like decoder (:class:`TinyGPT`: pre-norm blocks, causal SDPA, GELU
  MLP; built here, no weights downloaded) forward as it is vs inside ``rpka.swap.swap``, at
  each of ``--decoder-lengths``; ``decoder_train``: one training step of it (forward,
  next-token cross-entropy, backward);
* ``hf_gpt2``, ``hf_gpt2_train``: the same for a transformers GPT-2 built from its config,
  transformers' ``"sdpa"`` against RPKA registered by ``rpka.hf`` (empty without the
  ``hf`` extra).

    RPKA_NUMERICS=native OMP_NUM_THREADS=1 python scripts/bench_causal.py \\
        --out data/results/scaling/causal_cpu.json

A script, not a package command: the decoder row needs ``rpka.swap`` beside ``rpka.speed``'s
harness, two layers the package keeps independent (pyproject.toml, import-linter).
"""

from __future__ import annotations

import argparse
import copy
import inspect
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rpka import numerics
from rpka.attention import build
from rpka.attention.rpka import RPKAttention
from rpka.io import write_result_json
from rpka.speed.scaling import peak_memory_mib
from rpka.speed.timing import MIN_REPEATS, interleaved
from rpka.swap import swap

BATCH_HEADS, HEAD_DIM = 8, 64  # the shape: q, k, v (1, 8, n, 64)
EXACT = "exact-causal-sdpa"


def flop_ideal_speedup(n: int, rank: int, block: int, d: int = HEAD_DIM) -> float:
    """Exact causal attention's FLOPs over causal RPKA's (docs/speed.md, "Causal FLOP model").

    Exact (fused, masked half skipped): ``2 n^2 d``. RPKA per position: local block
    ``4 b d``; readout of the past ``2 r d + 2 r (d + 1)``; key moments of every key twice
    (once in its block, once in the prefix of the next draw) ``2 (2 r d + 2 r (d + 1))``;
    one r x (d + 1) solve per block ``2 r^2 (d + 1) / b``; pivots on every point of a
    doubling schedule (2n joint points in all, ``r d + r^2 / 2`` each).
    """
    readout = 2 * rank * d + 2 * rank * (d + 1)
    per_position = (
        4 * block * d
        + readout
        + 2 * readout
        + 2 * rank**2 * (d + 1) / block
        + 2 * (rank * d + rank**2 / 2)
    )
    return 2 * n * n * d / (n * per_position)


def qkv(n: int, seed: int, grad: bool = False) -> list[Tensor]:
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(1, BATCH_HEADS, n, HEAD_DIM, generator=g) for _ in range(3)]
    return [x.requires_grad_(grad) for x in xs]


def exact_causal(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def default_block() -> int:
    """RPKAttention's default ``causal_block`` (the one a user gets)."""
    return inspect.signature(RPKAttention).parameters["causal_block"].default


BLOCK: dict[str, int] = {}  # --block, when given: every RPKA arm's causal_block


def rpka_causal(rank: int, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    return build("rpka", rank=rank, causal=True, generator=g, **BLOCK)


def summarise(times: dict[str, dict[str, list[float]]], base: str) -> dict[str, dict]:
    """Medians, every repeat and the ratio of ``base``'s median to each arm's."""
    out = {}
    for label, series in times.items():
        row = {}
        for key in ("cpu_ms", "wall_ms"):
            row[key] = statistics.median(series[key])
            row[f"{key}_all"] = series[key]
        row["speedup_cpu"] = statistics.median(times[base]["cpu_ms"]) / row["cpu_ms"]
        out[label] = row
    return out


def forward_rows(
    lengths: Sequence[int], ranks: Sequence[int], block: int, warmup: int, repeats: int, seed: int
) -> list[dict]:
    rows = []
    for n in lengths:
        q, k, v = qkv(n, seed)
        calls: dict[str, Callable[[], object]] = {
            EXACT: lambda q=q, k=k, v=v: exact_causal(q, k, v)
        }
        for r in ranks:
            attn = rpka_causal(r, seed)
            calls[f"rpka-r{r}"] = lambda attn=attn, q=q, k=k, v=v: attn(q, k, v)
        with torch.no_grad():
            stats = summarise(interleaved(calls, warmup, repeats), EXACT)
        for label, row in stats.items():
            extra = {}
            if label != EXACT:
                rank = int(label.split("-r")[-1])
                ideal = flop_ideal_speedup(n, rank, block)
                extra = {
                    "flop_ideal_speedup": ideal,
                    "measured_over_ideal": ideal / row["speedup_cpu"],
                }
            rows.append({"n": n, "arm": label, **row, **extra})
    return rows


def sharp_rows(
    n: int, rank: int, logit_std: float, warmup: int, repeats: int, seed: int
) -> list[dict]:
    """The forward at sharper attention than ``forward_rows``' (where q, k ~ N(0, 1) give
    logits q.k / sqrt(d) of std 1): q scaled so that the logits' std is ``logit_std``, as in
    trained models. RPKA's landmarks then spread further and its key side and guards take
    their slower branches; exact attention's cost does not depend on the logits."""
    q, k, v = qkv(n, seed)
    q = q * logit_std
    attn = rpka_causal(rank, seed)
    calls = {EXACT: lambda: exact_causal(q, k, v), f"rpka-r{rank}": lambda: attn(q, k, v)}
    with torch.no_grad():
        stats = summarise(interleaved(calls, warmup, repeats), EXACT)
    return [{"n": n, "arm": label, "logit_std": logit_std, **row} for label, row in stats.items()]


def call_of(fn: Callable[..., Tensor], xs: Sequence[Tensor], train: bool) -> Callable[[], object]:
    """One call of ``fn`` on ``xs``: the forward, or (``train``) forward + backward of
    ``out.sum()``, the inputs' gradients dropped after it."""

    def run() -> object:
        out = fn(*xs)
        if train:
            out.sum().backward()
            for x in xs:
                x.grad = None
        return out

    return run


def forward_backward_rows(n: int, rank: int, warmup: int, repeats: int, seed: int) -> list[dict]:
    xs = qkv(n, seed, grad=True)
    attn = rpka_causal(rank, seed)
    calls = {EXACT: call_of(exact_causal, xs, True), f"rpka-r{rank}": call_of(attn, xs, True)}
    stats = summarise(interleaved(calls, warmup, repeats), EXACT)
    return [{"n": n, "arm": label, **row} for label, row in stats.items()]


def peak_rows(n: int, rank: int, seed: int, train: bool = False) -> list[dict]:
    """Peak memory of one causal forward (``train=False``, no gradients) or one forward +
    backward of ``out.sum()``, exact and RPKA, and its ratio to exact's."""
    xs = qkv(n, seed, grad=train)
    attn = rpka_causal(rank, seed)
    rows = []
    with torch.set_grad_enabled(train):
        call_of(attn, xs, train)()  # warm: lazy imports and compiled kernels allocate once
        for label, fn in ((EXACT, exact_causal), (f"rpka-r{rank}", attn)):
            peak = peak_memory_mib(call_of(fn, xs, train), "cpu")
            rows.append({"n": n, "arm": label, "peak_mib": peak})
    for row in rows:
        row["peak_over_exact"] = row["peak_mib"] / rows[0]["peak_mib"]
    return rows


# ----------------------------------------------------------------------------- decoder


class Block(nn.Module):
    """A GPT-2 block (nanoGPT's layout): pre-norm causal self-attention and a GELU MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: Tensor) -> Tensor:
        """x (B, n, width) -> (B, n, width)."""
        q, k, v = self.qkv(self.ln_1(x)).split(x.shape[-1], dim=-1)
        q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # what rpka.swap serves
        x = x + self.proj(y.transpose(1, 2).flatten(-2))
        return x + self.mlp(self.ln_2(x))


class TinyGPT(nn.Module):
    """Tokens (B, n) -> logits (B, n, vocab): embeddings, ``layers`` blocks, a tied head."""

    def __init__(self, vocab: int, length: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(length, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[-1]))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.T


def decoder_rows(
    n: int,
    rank: int,
    width: int,
    layers: int,
    heads: int,
    warmup: int,
    repeats: int,
    seed: int,
    train: bool = False,
) -> list[dict]:
    """The decoder's forward (``train=False``, no gradients) or one training step (forward,
    next-token cross-entropy, backward), as it is vs inside ``rpka.swap.swap``."""
    torch.manual_seed(seed)
    model = TinyGPT(vocab=256, length=n, width=width, layers=layers, heads=heads)
    model.train(train)
    tokens = torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(seed))
    swapped = swap("rpka", rank=rank, generator=torch.Generator().manual_seed(seed), **BLOCK)

    def call() -> object:
        if not train:
            return model(tokens)
        model.zero_grad(set_to_none=True)
        logits = model(tokens)
        F.cross_entropy(logits[0, :-1], tokens[0, 1:]).backward()
        return logits

    def rpka() -> object:
        with swapped:
            return call()

    return model_rows(
        "TinyGPT",
        {"exact": call, f"rpka-r{rank}": rpka},
        {"width": width, "layers": layers, "heads": heads, "n": n},
        lambda: {"sdpa_calls_served": swapped.swapped, "sdpa_calls_passed": swapped.passed},
        train,
        warmup,
        repeats,
    )


def model_rows(
    model: str,
    calls: dict[str, Callable[[], object]],
    shape: dict[str, int],
    served: Callable[[], dict[str, int]],
    train: bool,
    warmup: int,
    repeats: int,
) -> list[dict]:
    """A model's two arms (``calls``: "exact", then RPKA's) timed interleaved, with or
    without gradients, as rows: the model, its shape, the arm, its times; RPKA's row also
    the SDPA calls its swap served (``served()``, read after the timing)."""
    with torch.set_grad_enabled(train):
        stats = summarise(interleaved(calls, warmup, repeats), "exact")
    counts = served()
    return [
        {"model": model, **shape, "arm": label, **row, **(counts if label != "exact" else {})}
        for label, row in stats.items()
    ]


def hf_gpt2_rows(
    n: int,
    rank: int,
    width: int,
    layers: int,
    heads: int,
    warmup: int,
    repeats: int,
    seed: int,
    train: bool = False,
) -> list[dict]:
    """:func:`decoder_rows` for a transformers GPT-2 built from its config (no weights
    downloaded): transformers' own ``"sdpa"`` against RPKA registered by ``rpka.hf`` - the
    model as a user builds it. [] when transformers is not installed (the ``hf`` extra)."""
    try:
        import transformers

        import rpka.hf
    except ImportError:
        return []
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        vocab_size=256, n_positions=n, n_embd=width, n_layer=layers, n_head=heads,
        attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0,
    )  # fmt: skip
    name = rpka.hf.register(
        "rpka-bench", rank=rank, generator=torch.Generator().manual_seed(seed), **BLOCK
    )
    exact = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    swapped = copy.deepcopy(exact)
    swapped.set_attn_implementation(name)
    tokens = torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(seed))

    def step(model: nn.Module) -> Callable[[], object]:
        model.train(train)

        def call() -> object:
            if not train:
                return model(tokens).logits
            model.zero_grad(set_to_none=True)
            out = model(tokens, labels=tokens)
            out.loss.backward()
            return out.logits

        return call

    before = rpka.hf.registration(name).served
    return model_rows(
        "transformers GPT-2",
        {"exact": step(exact), f"rpka-r{rank}": step(swapped)},
        {"width": width, "layers": layers, "heads": heads, "n": n},
        lambda: {"sdpa_calls_served": rpka.hf.registration(name).served - before},
        train,
        warmup,
        repeats,
    )


# ----------------------------------------------------------------------------- command


def _load() -> list[float] | None:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    if args.block is not None:
        BLOCK["causal_block"] = args.block
    args.block = args.block or default_block()
    result = {
        "harness": "rpka.speed.causal_bench (interleaved, CPU time beside wall time)",
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "threads": torch.get_num_threads(),
        "numerics": numerics.record(),
        "torch": torch.__version__,
        "shapes": f"q, k, v: (1, {BATCH_HEADS}, n, {HEAD_DIM}) float32",
        "causal_block": args.block,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "load_average_start": _load(),
    }
    w, r = args.warmup, args.repeats
    result["forward"] = forward_rows(args.lengths, args.ranks, args.block, w, r, args.seed)
    result["forward_sharp"] = sharp_rows(
        args.train_length, args.train_rank, args.sharp_std, w, r, args.seed
    )
    write_result_json(args.out, result)
    result["forward_backward"] = forward_backward_rows(
        args.train_length, args.train_rank, w, r, args.seed
    )
    result["peak_memory"] = peak_rows(args.memory_length, args.train_rank, args.seed)
    result["peak_memory_train"] = peak_rows(
        args.memory_length, args.train_rank, args.seed, train=True
    )
    write_result_json(args.out, result)
    shape = (args.decoder_width, args.decoder_layers, args.decoder_heads)
    for key, rows_of, train in (
        ("decoder", decoder_rows, False),
        ("decoder_train", decoder_rows, True),
        ("hf_gpt2", hf_gpt2_rows, False),
        ("hf_gpt2_train", hf_gpt2_rows, True),
    ):
        result[key] = [
            row
            for n in args.decoder_lengths
            for row in rows_of(n, args.train_rank, *shape, w, r, args.seed, train)
        ]
        write_result_json(args.out, result)
    result["load_average_end"] = _load()
    write_result_json(args.out, result)
    return result


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python scripts/bench_causal.py", description=__doc__.split("\n")[0]
    )
    p.add_argument("--out", required=True, help="result JSON (written atomically)")
    p.add_argument("--lengths", type=_positive, nargs="+", default=[2048, 4096, 8192])
    p.add_argument("--ranks", type=_positive, nargs="+", default=[64, 16])
    p.add_argument("--block", type=_positive, default=None, help="causal_block (default: RPKA's)")
    p.add_argument("--train-length", type=_positive, default=4096)
    p.add_argument("--train-rank", type=_positive, default=64)
    p.add_argument("--memory-length", type=_positive, default=4096)
    p.add_argument("--sharp-std", type=float, default=3.0, help="the sharp forward row's logit std")
    p.add_argument(
        "--decoder-lengths", type=_positive, nargs="+", default=[2048, 4096],
        help="the decoder row's lengths (issue 55's target is stated at 2,048)",
    )  # fmt: skip
    p.add_argument("--decoder-width", type=_positive, default=256)
    p.add_argument("--decoder-layers", type=_positive, default=2)
    p.add_argument("--decoder-heads", type=_positive, default=4)
    p.add_argument("--threads", type=_positive, default=1)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=_positive, default=MIN_REPEATS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--smoke", action="store_true", help="tiny sizes, 1 repeat: checks the harness only"
    )
    return p


SMOKE = {
    "lengths": [128, 256],
    "train_length": 128,
    "memory_length": 128,
    "decoder_lengths": [64],
    "decoder_width": 32,
    "warmup": 0,
    "repeats": 1,
}


def main(argv: Sequence[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    if args.smoke:
        vars(args).update(SMOKE)
    elif args.repeats < MIN_REPEATS:
        parser().error(f"--repeats must be >= {MIN_REPEATS} (the protocol), got {args.repeats}")
    if args.decoder_width % args.decoder_heads:
        parser().error(
            f"--decoder-width ({args.decoder_width}) must be a multiple of --decoder-heads "
            f"({args.decoder_heads})"
        )
    if not args.sharp_std > 0:
        parser().error(f"--sharp-std must be > 0, got {args.sharp_std}")
    if args.warmup < 0:
        parser().error(f"--warmup must be >= 0, got {args.warmup}")
    result = run(args)
    for row in result["forward"]:
        print(
            f"n={row['n']:6d} {row['arm']:18s} {row['cpu_ms']:9.1f} ms  x{row['speedup_cpu']:.2f}"
        )
    for key in (
        "forward_sharp",
        "forward_backward",
        "decoder",
        "decoder_train",
        "hf_gpt2",
        "hf_gpt2_train",
    ):
        for row in result[key]:
            label = f"{key} n={row['n']} {row['arm']}"
            print(f"{label:36s} {row['cpu_ms']:9.1f} ms  x{row['speedup_cpu']:.2f}")
    for key in ("peak_memory", "peak_memory_train"):
        for row in result[key]:
            label = f"{key} {row['arm']}"
            print(f"{label:36s} {row['peak_mib']:7.1f} MiB  x{row['peak_over_exact']:.2f}")
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
