"""The inference key side in float32 or float64, against a float64 softmax (issue 39).

Duplicated keys (each key and value repeated 4 times, q, k, v (1, 2, 48, 16) float32) at
rising logit standard deviation: the 96 joint points hold 60 distinct ones, so RPKA at rank
60 runs the Nystrom estimator (not the full-rank exact path) and is exact in exact
arithmetic - every error is numerics. Three key sides: ``float32`` (forced, by lifting
``KEY_LOGIT_LIMIT``), ``auto`` (the default: float32 within the limit) and ``float64``.
Prints the relative error ``|out - ref|_F / |ref|_F`` and the largest logit reference
``max_s |rho_s|`` of the float32 pass (docs/numerics.md, "The key side in float32")::

    python scripts/key_precision_check.py
"""

from __future__ import annotations

import math

import torch

from rpka.attention import build, nystrom_chunked

STDS = (1.0, 4.0, 9.0, 16.0, 25.0, 36.0)
SEEDS = (0, 1)


def duplicated_keys(std: float, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, 48, 16, generator=g, dtype=torch.float64) for _ in range(3))
    k, v = (x[..., :12, :].repeat_interleave(4, -2) for x in (k, v))
    return tuple(x.float() for x in (q * std**0.5, k * std**0.5, v))


def relative_error(std: float, seed: int, precision: str) -> tuple[float, float]:
    """(error against the float64 softmax, largest |rho| of the first key pass)."""
    q, k, v = duplicated_keys(std, seed)
    ref = torch.softmax(q.double() @ k.double().transpose(-1, -2) / 4, -1) @ v.double()
    largest = []
    original = nystrom_chunked._streamed_key_moments

    def spy(*args: object) -> tuple[torch.Tensor, torch.Tensor]:
        rho, moments = original(*args)
        if not largest:  # the first (narrow, unless forced wide) pass
            largest.append(float(rho[torch.isfinite(rho)].abs().max()))
        return rho, moments

    nystrom_chunked._streamed_key_moments = spy
    limit = nystrom_chunked.KEY_LOGIT_LIMIT
    if precision == "float32":
        nystrom_chunked.KEY_LOGIT_LIMIT = math.inf
    try:
        key_precision = "float64" if precision == "float64" else "auto"
        attn = build("rpka", rank=60, generator=torch.Generator().manual_seed(1),
                     key_precision=key_precision)  # fmt: skip
        with torch.no_grad():
            out = attn(q, k, v)
    finally:
        nystrom_chunked._streamed_key_moments, nystrom_chunked.KEY_LOGIT_LIMIT = original, limit
    error = float((out.double() - ref).norm() / ref.norm())
    return error, largest[0] if largest else float("nan")


def main() -> None:
    print(f"KEY_LOGIT_LIMIT = {nystrom_chunked.KEY_LOGIT_LIMIT:g}")
    print("std   seed  max|rho| (first pass)    float32   auto      float64")
    for std in STDS:
        for seed in SEEDS:
            errors = {p: relative_error(std, seed, p) for p in ("float32", "auto", "float64")}
            print(
                f"{std:5.1f} {seed:4d}  {errors['float32'][1]:22.1f}  "
                + "  ".join(f"{errors[p][0]:.1e}" for p in ("float32", "auto", "float64"))
            )


if __name__ == "__main__":
    main()
