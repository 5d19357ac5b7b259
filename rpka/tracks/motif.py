"""Track ``forecast-motif``: continue a white-noise motif that occurred earlier in the window.

Issue 14 (docs/design.md). The primary forecast track: one that *needs attention*.
Every window draws a fresh library of ``n_motifs`` motifs, each ``motif_length`` i.i.d.
N(0, 1) steps, and lays them out one after another, each after a gap of 0..``gap_max``
N(0, 1) steps, starting at a random offset (so the first motif may be cut). The context
ends with the first ``cue_length`` steps of a motif that occurred *in full* earlier in the
window (chosen uniformly among the full occurrences); the target is its next ``horizon``
steps. Observation noise N(0, ``noise``^2) is added to every step, targets included:

    window = [ layout (L - c steps) | m[:c] ] -> target m[c : c + H] (+ noise)

Nothing but content can find the earlier occurrence - no fixed lag (gaps and offset are
random), no linear map (a fresh library per window makes the target independent of any
fixed linear functional of the context: its best linear forecast is ~the mean) and no
position index. A model that matches the cue against the context and copies what followed
reaches the noise floor (2 noise^2 after standardisation, about 0.02).

Windows are standardised by their context (``rpka.tracks.windows``). Train / validation /
test are drawn from independent seed streams; each window carries ``source`` (where in it
the copied occurrence starts) and ``motif`` (its index in the library) for the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rpka.checks import is_number, require
from rpka.tracks.common import SPLITS, require_int
from rpka.tracks.text import WindowText
from rpka.tracks.windows import WindowForecastTask, generated_arrays, window_loader

# learnability bar (issue 14): exact attention's test MSE at most this times the linear
# forecast's (the prototype reached 0.03-0.04 against linear's 1.0)
MOTIF_LINEAR_RATIO = 0.3


@dataclass(frozen=True)
class MotifConfig:
    """``forecast-motif`` (see the module docstring); lengths in steps."""

    name: str = "forecast-motif"
    context: int = 96
    horizon: int = 8
    n_motifs: int = 4
    motif_length: int = 16
    cue_length: int = 8
    gap_max: int = 7
    noise: float = 0.1
    n_train: int = 20_000
    n_val: int = 2_000
    n_test: int = 2_000
    seed: int = 0

    @property
    def season_period(self) -> int:
        """No season: the seasonal-naive forecast repeats the last ``horizon`` steps."""
        return self.horizon

    @property
    def layout_length(self) -> int:
        """Steps of the context before the final cue."""
        return self.context - self.cue_length

    @property
    def attention_tokens(self) -> int:
        """Tokens one attention call sees: one per context step."""
        return self.context

    def validate(self) -> None:
        require(self.name == "forecast-motif", "name", "'forecast-motif'", self.name)
        require_int(self, "n_motifs", 1)
        require_int(self, "motif_length", 2)
        require_int(self, "cue_length", 1, self.motif_length - 1)
        require_int(self, "horizon", 1, self.motif_length - self.cue_length)
        require_int(self, "gap_max", 0)
        # the layout must always hold one full motif whatever the offset and the gaps
        item = self.motif_length + self.gap_max
        require_int(self, "context", self.cue_length + 2 * item)
        require(is_number(self.noise) and self.noise >= 0, f"{self.name}.noise", ">= 0", self.noise)
        for split in SPLITS:
            require_int(self, f"n_{split}", 1)
        require_int(self, "seed", 0)


def layout(
    config: MotifConfig, library: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lay motifs out with gaps over the first ``layout_length`` steps of N windows.

    library: (N, K, M). Returns the layout (N, layout_length) and, per placed motif
    (N, n_items), its start and library index, with start -1 where it is not whole.
    """
    n, _, m = library.shape
    length = config.layout_length
    item = m + config.gap_max
    n_items = length // m + 2  # enough slots to run past the end from any offset
    values = rng.standard_normal((n, length))  # gap steps stay N(0, 1)
    position = -rng.integers(0, item, n)  # a random offset: the first motif may be cut
    starts = np.full((n, n_items), -1, dtype=np.int64)
    which = np.zeros((n, n_items), dtype=np.int64)
    rows = np.arange(n)[:, None]
    offsets = np.arange(m)
    for slot in range(n_items):
        start = position + rng.integers(0, config.gap_max + 1, n)
        k = rng.integers(0, library.shape[1], n)
        steps = start[:, None] + offsets  # (N, M)
        inside = (steps >= 0) & (steps < length)
        motif = library[np.arange(n), k]  # (N, M)
        values[np.broadcast_to(rows, steps.shape)[inside], steps[inside]] = motif[inside]
        whole = (start >= 0) & (start + m <= length)
        starts[:, slot] = np.where(whole, start, -1)
        which[:, slot] = k
        position = start + m
    return values, starts, which


def generate(config: MotifConfig, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """n raw windows (N, L + H) float64 and, per window, the copied occurrence's ``source``
    start and ``motif`` index (see the module docstring)."""
    library = rng.standard_normal((n, config.n_motifs, config.motif_length))
    values, starts, which = layout(config, library, rng)
    # choose uniformly among the whole occurrences: random scores, -inf where not whole
    scores = np.where(starts >= 0, rng.random(starts.shape), -np.inf)
    chosen = scores.argmax(1)
    rows = np.arange(n)
    source, motif = starts[rows, chosen], which[rows, chosen]
    if (source < 0).any():  # validate() rules this out; a guard against a future edit
        raise RuntimeError("a window has no whole motif occurrence")
    tail = library[rows, motif, : config.cue_length + config.horizon]  # cue + continuation
    clean = np.concatenate([values, tail], axis=1)
    raw = clean + config.noise * rng.standard_normal(clean.shape)
    return {"raw": raw, "source": source, "motif": motif}


def build_arrays(config: MotifConfig) -> dict[str, np.ndarray]:
    """``<split>_{x, y, mean, std}`` (standardised windows) and ``<split>_{source, motif}``."""
    return generated_arrays(config, generate)


load_motif = window_loader(MotifConfig, build_arrays)


class MotifTask(WindowForecastTask):
    """``forecast-motif``: the forecast model, loss and naive forecasts on this generator's windows;
    learnable when exact attention's test MSE is at most 0.3 x the linear forecast's."""

    name = "forecast-motif"
    config_class = MotifConfig
    build_arrays = staticmethod(build_arrays)
    out_dir = "forecast-motif"
    linear_ratio = MOTIF_LINEAR_RATIO
    text = WindowText(
        title="Motif forecast track",
        description=(
            "Every window draws a fresh library of white-noise motifs laid out with random gaps; "
            "its context ends with the start of a motif that occurred in full earlier, and the "
            "target is that motif's continuation (no fixed lag, linear map or position index can "
            "find it)."
        ),
        linear_ratio=MOTIF_LINEAR_RATIO,
    )
