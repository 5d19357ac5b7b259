"""One colour per arm, the same in every figure of the study (the palette's one owner).

An arm's colour follows from its name alone, never from its position in a list, so the
same arm has the same colour in every track's figures:

* ``exact`` black; the no-attention control (``mean-attention``) grey;
* RPKA at a rank (``rpka-r<k>``): gold to dark violet as the rank grows;
* an RPKA ablation (``rpka-r<k>-<variant>``): the variant's own colour;
* a peer method (``nystrom-uniform-r<k>``, ``keys-coreset-r<k>``, ...): the method's colour,
  at every rank (the frontier figure draws one line per method in the same colours);
* any other name: a colour from a fixed list, picked by a hash of the name (stable across
  runs and figures).

Colours are hex strings (Okabe-Ito / seaborn ``colorblind`` hues where they fit).
"""

from __future__ import annotations

import math
import re
import zlib

import matplotlib
import numpy as np

from rpka.attention import METHOD_INFO

# each method's colour: its anchor in the registry (rpka.attention.METHOD_INFO)
METHODS = {name: info.colour for name, info in METHOD_INFO.items() if info.colour is not None}
EXACT = METHODS["exact"]
CONTROL = METHODS["mean"]  # the no-attention control
PRIMARY = METHODS["rpka"]  # the pre-registered primary arm where a figure marks it by colour alone
VARIANTS = {  # RPKA's ablations: rpka-r<k>-<variant>
    "exp": "#029e73",
    "tempered": "#56b4e9",
    "keys": "#cc78bc",
    "greedy": "#7570b3",
    "batch-pivots": "#ca9161",
}
OTHER = ("#3b528b", "#21918c", "#b5bd00", "#a6761d", "#666666", "#e6ab02")
# RPKA's ranks: gold to dark violet as the rank grows (log-interpolated between these)
RANK_ANCHORS = {
    4: "#e6ab02",
    8: "#f28e2b",
    16: "#d95f02",
    32: "#c51b1b",
    64: "#7f0000",
    96: "#6a51a3",
    128: "#3f007d",
    1024: "#00545f",  # and above: full-rank positive controls (r1024, r4096), apart from r128
}

_RANKED = re.compile(r"^(?P<method>[a-z]+(?:-[a-z]+)*?)-r(?P<rank>\d+)(?:-(?P<variant>.+))?$")


def rank_colour(rank: int) -> str:
    """RPKA's colour at ``rank``: an anchor's (``RANK_ANCHORS``), else interpolated in
    log rank between its neighbours (clamped at the ends)."""
    if rank in RANK_ANCHORS:
        return RANK_ANCHORS[rank]
    ranks = sorted(RANK_ANCHORS)
    r = min(max(rank, ranks[0]), ranks[-1])
    hi = next(i for i, k in enumerate(ranks) if k >= r)
    lo = max(hi - 1, 0)
    a, b = ranks[lo], ranks[hi]
    t = 0.0 if a == b else (math.log2(r) - math.log2(a)) / (math.log2(b) - math.log2(a))
    ca, cb = (np.array(matplotlib.colors.to_rgb(RANK_ANCHORS[k])) for k in (a, b))
    return matplotlib.colors.to_hex((1 - t) * ca + t * cb)


def method_colour(method: str) -> str:
    """A method's colour (``rpka``, ``nystrom-uniform``, ...): the frontier's lines."""
    return METHODS.get(method) or OTHER[zlib.crc32(method.encode()) % len(OTHER)]


def arm_colour(name: str) -> str:
    """The colour of the arm named ``name`` (module docstring)."""
    if name in ("exact", "mean-attention"):
        return EXACT if name == "exact" else CONTROL
    match = _RANKED.match(name)
    if match:
        method, variant = match["method"], match["variant"]
        if method == "rpka" and variant is None:
            return rank_colour(int(match["rank"]))
        if method == "rpka":
            return VARIANTS.get(variant) or OTHER[zlib.crc32(variant.encode()) % len(OTHER)]
        if method in METHODS:
            return METHODS[method]
    return METHODS.get(name) or OTHER[zlib.crc32(name.encode()) % len(OTHER)]


def arm_colours(names: list[str]) -> dict[str, str]:
    """``{name: arm_colour(name)}``."""
    return {name: arm_colour(name) for name in names}
