"""Key padding and causal + key padding masks, served by any attention method (issue 52).

A mask is served when every query row sees a *prefix of the kept keys*, in their order:

    visible[i, j] = keep[j] and rank(j) < c_i,     rank(j) = #{kept keys before j}      (P)

with ``keep`` (S,) the keys some row sees and ``c_i`` the number of keys row i sees. (P)
holds for key padding (every ``c_i`` = n, the number of kept keys; Hugging Face's
``(B, 1, 1, S)`` or ``(B, 1, L, S)`` with equal rows), for causal + key padding (``c_i`` the
kept keys at or before query i: left- and right-padded decoder masks, a cached decode
step), and for fully masked rows (``c_i = 0``: the padded queries of a left-padded batch).

Served as what it is (landmarks among the kept keys only, masked keys contribute exactly
zero): the kept keys are gathered (compacted) and the method runs on them -

* rows that see all n kept keys: the method's non-causal form on (those rows, n keys);
* a causal *staircase* - the first rows to see 1, 2, ..., n kept keys (the real tokens of
  a padded decoder batch): the method's causal form on (those rows, n keys), the row that
  first sees c keys being position c - 1 of the compacted sequence;
* every other row that sees c > 0 keys (a right-padded query: c = n): the non-causal form
  on (the rows seeing c, the first c keys), one call per distinct c;
* fully masked rows: what SDPA returns for them - 0 for a boolean or ``-inf`` mask, the
  mean of all S values for a mask at the dtype's minimum (every logit then equals that
  minimum in floating point, so SDPA's softmax is uniform).

Rank and points: each call's method sees only the kept points (RPKA's joint set: those
rows' queries and the c kept keys), so ``rank >= rows + c`` is exact for RPKA and
``rank >= c`` for a key coreset; the causal form's blocks count compacted positions.

Calls are grouped: units (batch elements, or (batch, head) pairs for a per-head mask)
with the same row counts ``c`` share one plan and run batched, each gathering its own
kept keys. Anything else - a bias, a sliding window, a block mask, prefixes that do not
grow one key per query (a chunk after a cache) - is not of this form and is refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

FILLS = ("zero", "mean")  # what a fully masked row returns (SDPA's answer for the mask type)


@dataclass(frozen=True)
class RowSet:
    """Rows (long, (R,)) of one call on the first ``keys`` kept keys, causal or not."""

    rows: Tensor
    keys: int
    causal: bool


@dataclass(frozen=True)
class Group:
    """Units (long, (G,)) that share the row counts, and the calls that serve them."""

    members: Tensor
    keys: int  # n: the kept keys every member gathers (the largest c)
    calls: tuple[RowSet, ...]


@dataclass(frozen=True)
class PrefixMask:
    """A mask of form (P), planned.

    ``keep`` (U, S) bool and ``counts`` (U, L) long per unit; ``per_head``: a unit is a
    (batch, head) pair (the mask differs between heads), else a batch element with all
    its heads. ``fill``: "zero" or "mean" (:data:`FILLS`). ``groups``: the plan.
    """

    keep: Tensor
    counts: Tensor
    per_head: bool
    fill: str
    groups: tuple[Group, ...]

    @property
    def causal(self) -> bool:
        """Whether a call needs the method's causal form."""
        return any(call.causal for group in self.groups for call in group.calls)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """The shape (U, 1, L, S) of :meth:`dense`: callers that hold a prepared mask read
        its shape and ``ndim`` (transformers' generate with a static cache)."""
        return (self.keep.shape[0], 1, self.counts.shape[-1], self.keep.shape[-1])

    @property
    def ndim(self) -> int:
        return 4

    def unmasked(self, keys: int) -> bool:
        """Nothing hidden: every row sees every one of the S = ``keys`` keys."""
        return bool(self.keep.all()) and bool((self.counts == keys).all())

    def dense(self) -> Tensor:
        """The boolean mask (U, 1, L, S) of form (P) (``per_head``: units are (batch, head)
        pairs, reshape to (B, H, L, S)) - for a call passed to exact attention."""
        rank = self.keep.cumsum(-1) - 1
        visible = self.keep.unsqueeze(-2) & (rank.unsqueeze(-2) < self.counts.unsqueeze(-1))
        return visible.unsqueeze(1)

    def plain_causal(self, length: int, keys: int) -> bool:
        """SDPA's ``is_causal`` mask itself: L = S, every key kept, row i sees i + 1 keys."""
        if length != keys or not bool(self.keep.all()):
            return False
        steps = torch.arange(1, length + 1, device=self.counts.device)
        return bool((self.counts == steps).all())


class MaskRefused(ValueError):
    """A mask that is not a prefix of the kept keys per row (one line: why)."""


# ----------------------------------------------------------------------------- reading


def visible_of(mask: Tensor) -> tuple[Tensor, Tensor | None]:
    """A boolean or additive mask -> (visible bool, soft hidden bool or None).

    Additive masks must hold 0 and ``-inf`` or the dtype's minimum (Hugging Face's fill)
    only; ``soft`` marks the minimum, where a fully hidden row gets SDPA's uniform answer.
    """
    if mask.dtype == torch.bool:
        return mask, None
    if not mask.is_floating_point():
        raise MaskRefused(f"dtype {mask.dtype} (served: bool or floating point)")
    soft = mask == torch.finfo(mask.dtype).min
    hidden = (mask == -math.inf) | soft
    if not bool(((mask == 0) | hidden).all()):
        raise MaskRefused("an additive bias (served: 0 and -inf / the dtype's minimum)")
    return ~hidden, soft


def prefix_counts(visible: Tensor) -> tuple[Tensor, Tensor]:
    """visible (..., Lm, S) of form (P) -> keep (..., S), counts (..., Lm); raises
    :class:`MaskRefused` otherwise."""
    keep = visible.any(-2)
    counts = visible.sum(-1)
    rank = keep.cumsum(-1) - 1
    expected = keep.unsqueeze(-2) & (rank.unsqueeze(-2) < counts.unsqueeze(-1))
    if not bool((visible == expected).all()):
        raise MaskRefused(
            "not key padding or causal + key padding (each query must see a prefix of the "
            "unmasked keys)"
        )
    return keep, counts


def fill_of(visible: Tensor, soft: Tensor | None, counts: Tensor) -> str:
    """SDPA's answer for the fully masked rows: ``"zero"`` unless they are at the dtype's
    minimum throughout (then ``"mean"``); a row mixing both is refused."""
    empty = counts == 0
    if soft is None or not bool(empty.any()):
        return "zero"
    soft_rows = soft.sum(-1).expand_as(empty)[empty]
    if bool((soft_rows == visible.shape[-1]).all()):
        return "mean"
    if bool((soft_rows == 0).all()):
        return "zero"
    raise MaskRefused("fully masked rows mixing -inf and the dtype's minimum")


# ----------------------------------------------------------------------------- planning


def row_sets(counts: Tensor) -> tuple[RowSet, ...]:
    """The calls for one unit's row counts (L,) (module docstring); raises
    :class:`MaskRefused` when the rows that see more keys do not form a staircase."""
    n = int(counts.max())
    if n == 0:
        return ()
    seeing = counts > 0
    if bool((counts[seeing] == n).all()):  # key padding: every row sees every kept key
        return (RowSet(seeing.nonzero()[:, 0], n, False),)
    before = torch.cat([counts.new_zeros(1), counts.cummax(0).values[:-1]])
    first = counts > before  # the first row to see each new count
    steps = counts[first]
    if len(steps) != n or not bool((steps == torch.arange(1, n + 1, device=steps.device)).all()):
        raise MaskRefused(
            "the queries' prefixes of unmasked keys do not grow one key per query (causal + "
            "padding only; a chunk of queries after a cache is not served)"
        )
    calls = [RowSet(first.nonzero()[:, 0], n, True)]
    rest = seeing & ~first
    for c in torch.unique(counts[rest]).tolist():
        calls.append(RowSet((rest & (counts == c)).nonzero()[:, 0], int(c), False))
    return tuple(calls)


def plan(keep: Tensor, counts: Tensor, per_head: bool, fill: str) -> PrefixMask:
    """Group the units of keep (U, S), counts (U, L) by their counts and plan each group."""
    patterns, inverse = torch.unique(counts, dim=0, return_inverse=True)
    groups = []
    for index, pattern in enumerate(patterns):
        calls = row_sets(pattern)
        members = (inverse == index).nonzero()[:, 0]
        groups.append(Group(members, int(pattern.max()), calls))
    return PrefixMask(keep, counts, per_head, fill, tuple(groups))


def from_mask(mask: Tensor, q_shape: tuple[int, ...], keys: int) -> PrefixMask | None:
    """Plan an SDPA ``attn_mask`` for q of shape (..., L, E) and S = ``keys`` keys.

    None: the mask hides nothing (serve the call unmasked). Raises :class:`MaskRefused`
    with one line for a mask not of form (P). The mask may broadcast as SDPA's does over
    q's leading dims and over L; its last dim must be S. Units follow
    ``rpka.swap.sdpa.as_four_dims``: (B, H) for 4-d q, else (1, prod(leading dims)).
    """
    lead, length = tuple(q_shape[:-2]), q_shape[-2]
    if mask.dim() == 1:
        mask = mask.unsqueeze(0)  # (S,): one row for every query, as SDPA broadcasts it
    if mask.dim() > len(q_shape) or mask.shape[-1] != keys:
        raise MaskRefused(f"does not fit q {tuple(q_shape)} and S={keys} keys")
    m_lead = (1,) * (len(lead) - (mask.dim() - 2)) + tuple(mask.shape[:-2])
    fits = all(a in (1, b) for a, b in zip(m_lead, lead, strict=True))
    if mask.shape[-2] not in (1, length) or not fits:
        raise MaskRefused(f"does not broadcast to q {tuple(q_shape)}")
    visible, soft = visible_of(mask)
    if bool(visible.all()):
        return None
    keep, counts = prefix_counts(visible)
    fill = fill_of(visible, soft, counts)
    keep, counts = keep.reshape(*m_lead, keys), counts.reshape(*m_lead, -1).expand(*m_lead, length)
    if len(lead) == 2 and m_lead[-1] == 1:  # 4-d q, a mask of (B or 1, 1): every head alike
        per_head = False
        keep, counts = (x.expand(lead[0], *x.shape[1:])[:, 0] for x in (keep, counts))
    elif len(lead) != 2 and all(a == 1 for a in m_lead):  # one mask for the one batch unit
        per_head = False
        keep, counts = keep.reshape(1, keys), counts.reshape(1, length)
    else:
        per_head = True
        keep = keep.expand(*lead, keys).reshape(-1, keys)
        counts = counts.expand(*lead, length).reshape(-1, length)
    return plan(keep, counts.long(), per_head, fill)


def from_padding(keep: Tensor, length: int, causal: bool, offset: int = 0) -> PrefixMask:
    """Plan key padding keep (B, S) for L = ``length`` queries, causal or not: a causal query
    i sits at key position ``i + offset`` (``offset = S - L`` for the last L positions of
    a cache, Hugging Face's alignment) and sees the kept keys at or before it."""
    if causal:
        position = torch.arange(length, device=keep.device) + offset
        seen = keep.long().cumsum(-1)
        counts = seen[:, position.clamp(0, keep.shape[-1] - 1)]
        counts = torch.where(position >= 0, counts, 0)
    else:
        counts = keep.sum(-1, keepdim=True).expand(-1, length)
    return plan(keep, counts.long(), False, "zero")


# ----------------------------------------------------------------------------- serving


def kept_order(keep: Tensor, n: int) -> Tensor | int:
    """Positions of the first n kept keys, keep (G, S) -> (G, n) long; or, where they are
    one run of positions shared by the group (left or right padding), its start."""
    order = torch.sort((~keep).to(torch.uint8), dim=-1, stable=True).indices[:, :n]
    start = order[:1, :1]
    if bool((order == start + torch.arange(n, device=order.device)).all()):
        return int(start)
    return order


def gather_keys(x: Tensor, order: Tensor | int, n: int) -> Tensor:
    """The n kept keys of x (G, h, S, e) at ``order`` (:func:`kept_order`) -> (G, h, n, e):
    a view for a run, a gathered copy otherwise."""
    if isinstance(order, int):
        return x.narrow(-2, order, n)
    index = order[:, None, :, None].expand(x.shape[0], x.shape[1], n, x.shape[-1])
    return x.gather(-2, index)


def take_units(x: Tensor, members: Tensor) -> Tensor:
    """x's units ``members`` (sorted): a view where they are consecutive, else a copy."""
    first, count = int(members[0]), members.numel()
    if int(members[-1]) - first + 1 == count:
        return x.narrow(0, first, count)
    return x.index_select(0, members)


def attend(
    method: Callable[[Tensor, Tensor, Tensor, bool], Tensor],
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: PrefixMask,
    exact_keys: int = 0,
) -> Tensor:
    """Masked attention by ``method(q, k, v, causal)`` on the kept keys.

    q (B, H, L, E), k (B, H, S, E), v (B, H, S, Ev) -> (B, H, L, Ev); ``mask`` from
    :func:`from_mask` or :func:`from_padding`. A call on at most ``exact_keys`` kept keys
    runs exact attention (SDPA) instead: a rank that reaches a call's keys makes each of
    them a landmark, and full rank means exact (pass the method's rank). Each group's
    output is written once into the result. Differentiable (gathers, index copies).
    """
    batch, heads, length = q.shape[:3]
    if mask.per_head:
        q, k, v = (x.reshape(batch * heads, 1, *x.shape[-2:]) for x in (q, k, v))

    def run(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
        if k.shape[-2] <= exact_keys:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return method(q, k, v, causal)

    out = v.new_empty(*q.shape[:-1], v.shape[-1])
    for group in mask.groups:
        members = group.members
        q_g, k_g, v_g = (take_units(x, members) for x in (q, k, v))
        # written in place into a fresh tensor (autograd records it): no copy per group
        out.index_copy_(0, members, attend_group(run, q_g, k_g, v_g, mask, group))
    return out.reshape(batch, heads, length, -1)


def attend_group(
    method: Callable[[Tensor, Tensor, Tensor, bool], Tensor],
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: PrefixMask,
    group: Group,
) -> Tensor:
    """One group's output (G, h, L, Ev): its calls on the gathered kept keys, fully masked
    rows filled as SDPA fills them (:data:`FILLS`)."""
    length = q.shape[-2]
    if len(group.calls) == 1 and group.calls[0].rows.numel() == length:
        out = None  # one call covers every row: nothing to fill
    elif mask.fill == "mean":  # SDPA's uniform softmax over all S keys
        out = v.mean(-2, keepdim=True).expand(*q.shape[:-1], v.shape[-1])
    else:
        out = v.new_zeros(*q.shape[:-1], v.shape[-1])
    if not group.calls:  # every row fully masked
        return out
    order = kept_order(take_units(mask.keep, group.members), group.keys)
    k_g, v_g = (gather_keys(x, order, group.keys) for x in (k, v))
    for call in group.calls:
        part = method(
            q if out is None else q.index_select(2, call.rows),
            k_g[..., : call.keys, :],
            v_g[..., : call.keys, :],
            call.causal,
        )
        out = part if out is None else out.index_copy(2, call.rows, part.to(out.dtype))
    return out
