"""Issue 55: where a causal RPKA forward's CPU time goes, part by part.

Wraps the parts of ``rpka.attention.causal`` / ``causal_landmarks`` with CPU timers
(``time.process_time``), runs 2 warm-up and 3 timed forwards of q, k, v (1, 8, n, 64)
float32 without gradients, one thread, and prints each part's mean per forward beside exact
causal SDPA's. Parts nest only where named ("combine" holds the fused combine).

    RPKA_NUMERICS=native OMP_NUM_THREADS=1 python scripts/causal_profile.py N RANK [BLOCK]
"""

import sys
import time

import torch
import torch.nn.functional as F

import rpka.attention.causal as causal
import rpka.attention.causal_landmarks as cl
from rpka.attention import build
from rpka.attention.rpka import CAUSAL_BLOCK

T: dict[str, float] = {}


def timed(label, f):
    def wrapper(*a, **kw):
        start = time.process_time()
        out = f(*a, **kw)
        T[label] = T.get(label, 0.0) + time.process_time() - start
        return out

    return wrapper


def instrument() -> None:
    cl.LandmarkSampler.pivots = timed("pivots", cl.LandmarkSampler.pivots)
    cl.landmark_cholesky = timed("landmark Cholesky", cl.landmark_cholesky)
    cl.WideKeys.moments = timed("key moments (logits, exp, matmul)", cl.WideKeys.moments)
    cl.prefix_merge = timed("moments merge", cl.prefix_merge)
    cl.solve_core = timed("core solve", cl.solve_core)
    cl.LandmarkSet.past_logits = timed("past logits", cl.LandmarkSet.past_logits)
    cl.LandmarkSet.past_logits_unshifted = timed(
        "past logits", cl.LandmarkSet.past_logits_unshifted
    )
    causal.LocalPart.combine = timed("combine (eq. 1, guards)", causal.LocalPart.combine)
    causal.fused_local = timed("local part (fused)", causal.fused_local)
    causal.local_scores = timed("local scores", causal.local_scores)
    causal.running_range = timed("running value range", causal.running_range)
    causal.causal_forward = timed("causal_forward", causal.causal_forward)


def main(n: int, rank: int, block: int) -> None:
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, n, 64, generator=g) for _ in range(3))
    attn = build("rpka", rank=rank, causal=True, causal_block=block, generator=g)
    instrument()
    reps = 3
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
    for label, seconds in sorted(T.items(), key=lambda x: -x[1]):
        print(f"  {label:36s} {seconds / reps * 1e3:8.1f} ms")
    print(
        f"  {'rest of the forward (glue)':36s} {(forward - sum(T.values()) / reps) * 1e3:8.1f} ms"
    )
    print(f"  {'outside the forward (scaling, check)':36s} {(total - forward) * 1e3:8.1f} ms")


if __name__ == "__main__":
    args = [int(x) for x in sys.argv[1:]]
    main(args[0], args[1], args[2] if len(args) > 2 else CAUSAL_BLOCK)
