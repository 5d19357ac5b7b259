"""The rejection sweep of accelerated RPCholesky as one Triton kernel (CUDA only).

:func:`rpka.attention.sweep._sweep_torch` is the reference: b sequential steps on a
b x b tile, a handful of tiny PyTorch ops each - launch-bound on a GPU. Here one program
per batch element keeps the tile in registers and runs all b steps, so a round costs one
launch. Used automatically for CUDA tensors when Triton imports and
``RPKA_DISABLE_TRITON`` is not set; any failure falls back to the PyTorch sweep with a
warning (the result is the same up to float round-off).
"""

from __future__ import annotations

import os
import warnings

import torch
from torch import Tensor

try:  # Triton ships with CUDA builds of torch; the CPU wheel has none
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover - depends on the install
    triton = None

_broken = False


def available() -> bool:
    """True when the fused sweep can be tried (Triton imported, not disabled, not failed)."""
    return triton is not None and not _broken and not os.environ.get("RPKA_DISABLE_TRITON")


if triton is not None:

    @triton.jit
    def _sweep_kernel(gram_ptr, thr_ptr, col_ptr, b, BLOCK: tl.constexpr):
        """One batch element: accept/eliminate candidates 0..b-1 in order (see _sweep_torch)."""
        pid = tl.program_id(0).to(tl.int64)
        idx = tl.arange(0, BLOCK)
        inside = idx < b
        base = pid * b * b
        tile = idx[:, None] * b + idx[None, :]
        h = tl.load(gram_ptr + base + tile, mask=inside[:, None] & inside[None, :], other=0.0)
        thr = tl.load(thr_ptr + pid * b + idx, mask=inside, other=0.0)
        for j in range(b):
            is_j = idx == j
            col = tl.sum(tl.where(is_j[None, :], h, 0.0), axis=1)  # h[:, j]
            pivot = tl.sum(tl.where(is_j, col, 0.0), axis=0)  # h[j, j]
            limit = tl.sum(tl.where(is_j, thr, 0.0), axis=0)
            ok = pivot > limit
            scale = tl.where(ok, 1.0 / tl.sqrt(tl.where(ok, pivot, 1.0)), 0.0)
            col = col * scale
            h = h - col[:, None] * col[None, :]
            tl.store(col_ptr + base + idx * b + j, col, mask=inside)


def sweep(gram: Tensor, threshold: Tensor) -> tuple[Tensor, Tensor] | None:
    """Same contract as ``sweep._sweep_torch``: gram (B, b, b), threshold (B, b) ->
    accept, cols; or None where the kernel cannot serve (not float32, or it failed).

    On any error the kernel is switched off for the process, with a warning, and the
    caller (``sweep.rejection_sweep``) falls back to the PyTorch sweep.
    """
    global _broken
    if gram.dtype != torch.float32:
        return None
    try:
        gram = gram.contiguous()
        threshold = threshold.to(gram.dtype).contiguous()
        batch, b = threshold.shape
        cols = torch.empty_like(gram)
        block = max(16, triton.next_power_of_2(b))
        _sweep_kernel[(batch,)](
            gram, threshold, cols, b, BLOCK=block, num_warps=4 if b <= 64 else 8
        )
        return cols.diagonal(dim1=-2, dim2=-1) > 0, cols
    except Exception as err:  # compile or launch failure: keep working, say so once
        _broken = True
        warnings.warn(f"Triton rejection sweep failed ({err!r}); using PyTorch", stacklevel=2)
        return None
