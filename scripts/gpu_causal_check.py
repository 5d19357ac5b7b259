"""Causal RPKA on CUDA: no leakage, full rank = exact, decoding = forward (issue 7).

The CPU test suite (tests/test_causal.py) checks the same bit for bit; on a GPU the
kernels may pick reduction orders by shape, so this checks float64 to 1e-12. Exits
non-zero on failure. ``PYTHONPATH=. python scripts/gpu_causal_check.py [device]``
"""

import sys

import torch

from rpka.attention import build


def main(dev: str = "cuda") -> int:
    if dev == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 0
    gen = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (
        torch.randn(2, 4, 300, 16, device=dev, dtype=torch.float64, generator=gen) for _ in range(3)
    )

    def rpka(**options):
        return build(
            "rpka", causal=True, generator=torch.Generator(device=dev).manual_seed(1), **options
        )

    failures = []
    for name, make in (
        ("exact", lambda: build("exact", causal=True)),
        ("rpka", lambda: rpka(rank=16, causal_block=32)),
    ):
        out = make()(q, k, v)
        for t in (0, 31, 32, 100, 250):
            q2, k2, v2 = (x.clone() for x in (q, k, v))
            for x in (q2, k2, v2):
                x[..., t + 1 :, :] = 3 * torch.randn_like(x[..., t + 1 :, :])
            diff = (make()(q2, k2, v2)[..., : t + 1, :] - out[..., : t + 1, :]).abs().max().item()
            if diff > 1e-12:
                failures.append(f"{name} leaks at t={t}: {diff:.2e}")
    n = 96
    scores = q[..., :n, :] @ k[..., :n, :].transpose(-1, -2) / 4
    mask = torch.ones(n, n, dtype=torch.bool, device=dev).triu(1)
    ref = torch.softmax(scores.masked_fill(mask, float("-inf")), -1) @ v[..., :n, :]
    full = rpka(rank=2 * n, causal_block=16)(q[..., :n, :], k[..., :n, :], v[..., :n, :])
    err = ((full - ref).norm() / ref.norm()).item()
    if err > 1e-6:
        failures.append(f"full rank differs from exact: {err:.2e}")
    forward = rpka(rank=16, causal_block=32)(q, k, v)
    attn = rpka(rank=16, causal_block=32)
    outs, state = attn.prefill(q[..., :70, :], k[..., :70, :], v[..., :70, :])
    outs = [outs]
    for t in range(70, 300):
        out_t, state = attn.step(
            q[..., t : t + 1, :], k[..., t : t + 1, :], v[..., t : t + 1, :], state
        )
        outs.append(out_t)
    diff = (torch.cat(outs, -2) - forward).abs().max().item()
    if diff > 1e-10:
        failures.append(f"decoding differs from the forward: {diff:.2e}")
    half = rpka(rank=16, causal_block=32)(*(x.to(torch.bfloat16) * 30 for x in (q, k, v)))
    if not torch.isfinite(half).all():
        failures.append("bf16 x30 output not finite")
    where = torch.cuda.get_device_name() if dev == "cuda" else dev
    print(
        f"causal check on {where}: full-rank rel err {err:.1e}, "
        f"decode vs forward {diff:.1e}; "
        + ("FAILED: " + "; ".join(failures) if failures else "all passed")
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))  # optional argument: the device (default cuda)
