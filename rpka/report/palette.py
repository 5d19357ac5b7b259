"""One colour per arm, the same in every figure of the study (the palette's one owner).

An arm's colour follows from its name alone, never from its position in a list, so the
same arm has the same colour in every track's figures:

* ``exact`` black; the no-attention control (``mean-attention``) grey;
* RPKA at a rank (``rpka-r<k>``): gold to dark violet as the rank grows;
* an RPKA ablation (``rpka-r<k>-<variant>``): the variant's own colour;
* a peer method (``nystrom-uniform-r<k>``, ``keys-coreset-r<k>``, ...): the method's colour
  (the frontier figure draws one line per method in it), exactly at rank
  :data:`PEER_BASE_RANK` and lighter below it, darker above it (:func:`peer_colour`), so
  that two ranks of one peer in one panel stay apart;
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


PEER_BASE_RANK = 64  # a peer's rank drawn in its method's own colour
PEER_SHADE = 0.45  # the largest share of white (low ranks) or black (high ranks) mixed in


def peer_colour(method: str, rank: int) -> str:
    """A peer arm's colour: the method's, mixed with white below :data:`PEER_BASE_RANK` or
    black above it, by up to :data:`PEER_SHADE` at four doublings away (distinct per rank
    from 4 to 1,024)."""
    step = max(-1.0, min(1.0, (math.log2(rank) - math.log2(PEER_BASE_RANK)) / 4))
    base = np.array(matplotlib.colors.to_rgb(method_colour(method)))
    target = np.zeros(3) if step > 0 else np.ones(3)
    return matplotlib.colors.to_hex(base + abs(step) * PEER_SHADE * (target - base))


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
            return peer_colour(method, int(match["rank"]))
    return METHODS.get(name) or OTHER[zlib.crc32(name.encode()) % len(OTHER)]


def arm_colours(names: list[str]) -> dict[str, str]:
    """``{name: arm_colour(name)}``."""
    return {name: arm_colour(name) for name in names}
