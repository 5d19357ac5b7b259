"""Issue 55: where a causal RPKA forward's CPU time goes, part by part.

Wraps the parts of the streamed inference path (``rpka.attention.causal_stream``) with CPU timers
(``time.process_time``), runs 2 warm-up and 5 timed forwards of q, k, v (1, H, n, 64)
float32 without gradients, one thread, and prints each part's mean per forward beside exact
causal SDPA's. Parts nest only where named ("combine" holds the fused combine). H = 8, or
the environment's ``HEADS`` (4: the heads of ``bench_causal.py``'s decoder row); q scaled
by the environment's ``LOGIT_STD`` (default 1: the logits q.k / sqrt(d) then have that std,
as ``bench_causal.py``'s ``forward_sharp`` row at 3).

    RPKA_NUMERICS=native OMP_NUM_THREADS=1 [HEADS=4] [LOGIT_STD=3] \
        python scripts/causal_profile.py N RANK [BLOCK]
"""

import os
import sys
import time

import torch
import torch.nn.functional as F

import rpka.attention.causal as causal
import rpka.attention.causal_stream as cs
from rpka.attention import build
from rpka.attention.rpka import CAUSAL_BLOCK

T: dict[str, float] = {}
HEADS = int(os.environ.get("HEADS", "8"))  # the decoder row of bench_causal.py has 4
LOGIT_STD = float(os.environ.get("LOGIT_STD", "1"))  # q.k / sqrt(d) of q, k ~ N(0, 1): std 1


def timed(label, f):
    def wrapper(*a, **kw):
        start = time.process_time()
        out = f(*a, **kw)
        T[label] = T.get(label, 0.0) + time.process_time() - start
        return out

    return wrapper


def instrument() -> None:
    """Wrap the streamed inference path's parts (``rpka.attention.causal_stream``)."""
    for label, name in (
        ("local part (fused SDPA, stacked blocks)", "fused_local"),
        ("value range (block starts)", "block_ranges"),
        ("draws (pivots + landmark Cholesky)", "draw"),
        ("key moments (chunks)", "chunk_moments"),
        ("combine (logits, eq. 1, guards)", "combine_rows"),
        ("  of which guard 3 (clamp check)", "clamp_rows"),
        ("  of which guard 3's exact range", "range_outside"),
    ):
        if hasattr(cs, name):  # an older checkout may lack a part
            setattr(cs, name, timed(label, getattr(cs, name)))
    cs.LandmarkSet.solve = timed("  of which core solves", cs.LandmarkSet.solve)
    causal.stream_forward = timed("causal_forward", cs.stream_forward)


def main(n: int, rank: int, block: int) -> None:
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, n, 64, generator=g) for _ in range(3))
    q = q * LOGIT_STD
    attn = build("rpka", rank=rank, causal=True, causal_block=block, generator=g)
    instrument()
    reps = 5
    with torch.no_grad():
        for _ in range(2):
            attn(q, k, v)
        T.clear()
        start = time.process_time()
        for _ in range(reps):
            attn(q, k, v)
        total = (time.process_time() - start) / reps
        start = time.process_time()
        for _ in range(reps):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
        exact = (time.process_time() - start) / reps
    print(f"n={n} r={rank} b={block}: rpka {total * 1e3:.1f} ms, exact {exact * 1e3:.1f} ms")
    forward = T.pop("causal_forward") / reps
    nested = {label: T.pop(label) / reps for label in list(T) if label.startswith("  of which")}
    for label, seconds in sorted(T.items(), key=lambda x: -x[1]):
        print(f"  {label:40s} {seconds / reps * 1e3:8.1f} ms")
        if label.startswith("combine"):  # the parts timed inside it
            for inner, part in nested.items():
                print(f"  {inner:40s} {part * 1e3:8.1f} ms")
    print(
        f"  {'rest of the forward (glue)':40s} {(forward - sum(T.values()) / reps) * 1e3:8.1f} ms"
    )
    print(f"  {'outside the forward (input check)':40s} {(total - forward) * 1e3:8.1f} ms")


if __name__ == "__main__":
    args = [int(x) for x in sys.argv[1:]]
    main(args[0], args[1], args[2] if len(args) > 2 else CAUSAL_BLOCK)
