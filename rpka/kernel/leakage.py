"""The leakage check for the report: does output t read any input after t? (issue 7)

For random q, k, v and several positions t, every input at positions > t is redrawn (and
scaled up, so that maxima and norms move too) and the outputs recomputed; a causal method
must leave outputs 0..t unchanged. The table gives ``max |change|`` of outputs 0..t per t
for exact attention with ``is_causal``, causal RPKA, and the non-causal RPKA - which must
leak, showing that the check can fail. Random draws are the same in both passes (each
pass builds its method from the same seeded generator), so a change can only come from the
redrawn inputs. The tests (``tests/test_causal.py``) make the same check an assertion;
this module is the report's view of it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
import torch
from torch import Tensor, nn

from rpka.attention import build

# float64 outputs closer than this are equal up to reduction order (issue 7)
TOLERANCE = 1e-12


@dataclass(frozen=True)
class LeakageConfig:
    """Shapes and positions of the check (float64 on the CPU).

    ``times`` include positions inside the first block, at block ends and starts, and late.
    """

    batch: int = 2
    heads: int = 2
    n: int = 64
    head_dim: int = 16
    rank: int = 8
    causal_block: int = 8
    times: tuple[int, ...] = (0, 5, 7, 8, 31, 47, 62)
    seed: int = 0

    def validate(self) -> None:
        for name in ("batch", "heads", "n", "head_dim", "rank", "causal_block"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not self.times or any(not 0 <= t < self.n - 1 for t in self.times):
            raise ValueError(
                f"times must be positions in [0, n - 1 = {self.n - 1}) (a future must exist), "
                f"got {self.times!r}"
            )


def methods(config: LeakageConfig) -> dict[str, Callable[[], nn.Module]]:
    """Label -> a fresh method (same seeded pivot draws at every call)."""

    def generator() -> torch.Generator:
        return torch.Generator().manual_seed(config.seed)

    rank, block = config.rank, config.causal_block
    return {
        "exact (is_causal)": lambda: build("exact", causal=True),
        f"rpka causal (r={rank}, block={block})": lambda: build(
            "rpka", causal=True, rank=rank, causal_block=block, generator=generator()
        ),
        f"rpka non-causal (r={rank})": lambda: build("rpka", rank=rank, generator=generator()),
    }


def with_new_future(xs: list[Tensor], t: int, seed: int) -> list[Tensor]:
    """Copies of the inputs with every position > t redrawn, 3x larger."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for x in xs:
        y = x.clone()
        future = y[..., t + 1 :, :]
        y[..., t + 1 :, :] = 3 * torch.randn(future.shape, generator=generator, dtype=y.dtype)
        out.append(y)
    return out


@torch.no_grad()
def leakage_check(config: LeakageConfig | None = None) -> pd.DataFrame:
    """One row per method: ``max |change|`` of outputs 0..t for each t, the largest over t,
    the smallest change of outputs after t (> 0: the new inputs did reach the outputs),
    and the verdict: bit-identical, within ``TOLERANCE``, or leaks."""
    config = LeakageConfig() if config is None else config
    config.validate()
    generator = torch.Generator().manual_seed(config.seed)
    shape = (config.batch, config.heads, config.n, config.head_dim)
    qkv = [torch.randn(shape, generator=generator, dtype=torch.float64) for _ in range(3)]
    rows = []
    with warnings.catch_warnings():
        # random, unstructured inputs that test causality only: how often a guard fires on
        # them says nothing about a trained model (runs record their guard counts)
        warnings.filterwarnings("ignore", message="rpka: the .* guard fired")
        for label, make in methods(config).items():
            rows.append(_leakage_row(config, label, make, qkv))
    return pd.DataFrame(rows).set_index("method")


def _leakage_row(
    config: LeakageConfig, label: str, make: Callable[[], nn.Module], qkv: list[Tensor]
) -> dict[str, object]:
    """One method's row of :func:`leakage_check`."""
    out = make()(*qkv)
    row: dict[str, object] = {"method": label}
    past, future = [], []
    for t in config.times:
        changed = make()(*with_new_future(qkv, t, seed=config.seed + 1 + t))
        past.append((changed[..., : t + 1, :] - out[..., : t + 1, :]).abs().max().item())
        future.append((changed[..., t + 1 :, :] - out[..., t + 1 :, :]).abs().max().item())
        row[f"t={t}"] = past[-1]
    worst = max(past)
    row["max |change| of outputs <= t"] = worst
    row["min |change| of outputs > t"] = min(future)
    if worst == 0:
        row["verdict"] = "causal (bit-identical)"
    elif worst <= TOLERANCE:
        row["verdict"] = f"causal (within {TOLERANCE:g})"
    else:
        row["verdict"] = "leaks"
    return row
