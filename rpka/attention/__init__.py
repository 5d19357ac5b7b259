"""Attention methods behind one interface, chosen by name.

>>> attn = build("rpka", rank=32)
>>> out = attn(q, k, v)          # q, k, v: (B, H, n, d) -> (B, H, n, d)

May import: the root modules io, paths, checks and numerics only; every other stage
imports it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from torch import nn

from rpka.attention.base import AttentionMethod, check_qkv
from rpka.attention.exact import ExactAttention
from rpka.attention.keys_coreset import KeysCoresetAttention
from rpka.attention.local import LocalAttention
from rpka.attention.mean import MeanAttention
from rpka.attention.nystrom import nystrom_softmax
from rpka.attention.nystrom_uniform import NystromUniformAttention
from rpka.attention.nystromformer import NystromformerAttention
from rpka.attention.performer import PerformerAttention
from rpka.attention.rpcholesky import CholeskyResult, gaussian_kernel, rpcholesky
from rpka.attention.rpka import RPKAttention

REGISTRY: dict[str, type[AttentionMethod]] = {
    "exact": ExactAttention,
    "rpka": RPKAttention,
    # peers (docs/design.md section 2), each citing its paper
    "nystrom-uniform": NystromUniformAttention,
    "keys-coreset": KeysCoresetAttention,
    "nystromformer": NystromformerAttention,
    "performer": PerformerAttention,
    # a control: uniform attention (q = 0), how much a track needs attention at all
    "mean": MeanAttention,
    # a control: softmax over a sliding window of keys, how far back a track looks
    "local": LocalAttention,
}


@dataclass(frozen=True)
class MethodInfo:
    """What the study and its report know of a method beside its class: the report and
    the studies read these instead of lists of names (a new method is one entry here).

    ``family``: ``exact``, ``rpka``, ``peer`` (an approximation from the literature) or
    ``control`` (a method that answers how much a track needs attention, or how far back).
    ``colour``: the anchor of its colour in every figure (``rpka.report.palette``; None:
    a colour picked by a hash of the name). ``has_rank``: it takes a ``rank`` option (its
    arms are named ``<method>-r<k>``). ``landmarks``: the point set its landmarks are
    drawn from - ``joint`` (queries and keys, 2n points), ``keys`` (n) - or None where it
    draws none (``draws_landmarks``). ``marker``: its marker in the frontier figures.
    ``label``: its short name in tables,
    legends and prose (None: its registry name; :func:`method_label`); ``long_label``: its
    name where the short one alone would be unclear (None: ``label``)."""

    family: str
    colour: str | None = None
    has_rank: bool = False
    landmarks: str | None = None
    marker: str | None = None
    label: str | None = None
    long_label: str | None = None

    @property
    def draws_landmarks(self) -> bool:
        return self.landmarks is not None


METHOD_INFO: dict[str, MethodInfo] = {
    "exact": MethodInfo("exact", colour="#000000"),
    "rpka": MethodInfo(
        "rpka",
        colour="#de8f05",
        has_rank=True,
        landmarks="joint",
        marker="o",
        label="RPKA",
    ),
    "nystrom-uniform": MethodInfo(
        "peer",
        colour="#0173b2",
        has_rank=True,
        landmarks="joint",
        marker="s",
        label="uniform",
        long_label="uniform landmarks",
    ),
    "keys-coreset": MethodInfo(
        "peer",
        colour="#6a3d9a",
        has_rank=True,
        landmarks="keys",
        marker="^",
        label="key coreset",
    ),
    "nystromformer": MethodInfo("peer", colour="#e7298a", has_rank=True),
    "performer": MethodInfo("peer", colour="#999933", has_rank=True),
    "mean": MethodInfo("control", colour="#949494"),
    "local": MethodInfo("control"),
}

# the methods that draw landmarks (RPKA and the peers that pick points), in REGISTRY order
LANDMARK_METHODS: tuple[str, ...] = tuple(n for n in REGISTRY if METHOD_INFO[n].draws_landmarks)
# those that draw them among the queries and keys together (RPKA and uniform landmarks)
JOINT_LANDMARK_METHODS: tuple[str, ...] = tuple(
    n for n in LANDMARK_METHODS if METHOD_INFO[n].landmarks == "joint"
)


def method_label(name: str, long: bool = False) -> str:
    """``name``'s label (:class:`MethodInfo`): ``label``, with ``long`` its ``long_label``
    where it has one; its name where it has none or is not registered."""
    info = METHOD_INFO.get(name)
    if info is None:
        return name
    return (info.long_label if long else None) or info.label or name


def options_of(name: str) -> dict[str, object]:
    """The options ``name`` accepts, with their defaults."""
    cls = method_class(name)
    params = inspect.signature(cls.__init__).parameters
    return {key: p.default for key, p in params.items() if key != "self"}


def method_class(name: str) -> type[AttentionMethod]:
    if name not in REGISTRY:
        raise ValueError(f"unknown attention method {name!r}; valid: {sorted(REGISTRY)}")
    return REGISTRY[name]


def build(name: str, **options: object) -> nn.Module:
    """Instantiate the attention method ``name`` with ``options``.

    Raises ``ValueError`` for an unknown name or option, listing the valid ones.
    """
    cls = method_class(name)
    valid = options_of(name)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown} for attention method {name!r}; valid: {sorted(valid)}"
        )
    return cls(**options)


__all__ = [
    "JOINT_LANDMARK_METHODS",
    "LANDMARK_METHODS",
    "METHOD_INFO",
    "REGISTRY",
    "AttentionMethod",
    "CholeskyResult",
    "ExactAttention",
    "KeysCoresetAttention",
    "LocalAttention",
    "MeanAttention",
    "MethodInfo",
    "NystromUniformAttention",
    "NystromformerAttention",
    "PerformerAttention",
    "RPKAttention",
    "build",
    "check_qkv",
    "gaussian_kernel",
    "method_class",
    "method_label",
    "nystrom_softmax",
    "options_of",
    "rpcholesky",
]
