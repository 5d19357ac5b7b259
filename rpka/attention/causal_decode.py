"""Causal RPKA, decoding: the forward of ``causal`` one token at a time.

``prefill`` runs the forward over a prompt and returns the state that continues it; ``step``
adds one token. The state holds the landmarks, ``G_ZZ^{-1} M_c`` of the current block, the
reference ``rho_c`` and the running value range, so a step costs ``O(r d + b d)`` whatever
the context length; the step that finishes a block folds it into ``M`` (``O(b r d)``). At a
draw block the landmarks are redrawn from the whole prefix - ``O(t r (d + r))`` at position
``t``, amortised ``O(r (d + r))`` per token since draws come when the context doubles - so
the state keeps ``q~`` (joint pivot set), ``k~`` and ``v`` of every position: the memory of
a KV cache. The step path follows the same schedule and the same random draws as the full
forward, so both agree to round-off.

Equations, schedule and guards: :mod:`rpka.attention.causal` (eq. (1), (2)); the
landmarks and key moments: :mod:`rpka.attention.causal_landmarks`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rpka.attention.cache import GrowingBuffer
from rpka.attention.causal import (
    CausalOptions,
    causal_forward,
    combine,
    count_exact_rows,
    count_guards,
    local_scores,
    sampler_of,
    scaled,
)
from rpka.attention.causal_landmarks import (
    LandmarkSampler,
    LandmarkSet,
    Moments,
    next_draw,
    past_is_exact,
)
from rpka.attention.nystrom import Core

# ----------------------------------------------------------------------------- decoding


@dataclass
class CausalState:
    """Decoding state of causal RPKA after ``length`` tokens (see the module docstring).

    Buffers hold scaled queries (joint pivot set only), scaled uncentred keys and values
    of every position; ``moments``/``core`` cover the positions before the current block.
    """

    queries: GrowingBuffer | None
    keys: GrowingBuffer
    values: GrowingBuffer
    centre: Tensor | None
    landmarks: LandmarkSet | None  # None while the current block's past is exact
    moments: Moments | None
    core: Core | None  # G_ZZ^{-1} M of the current block
    next_draw: int
    v_low: Tensor  # (..., 1, d_v) running min of the values
    v_high: Tensor
    guards: dict[str, Tensor]

    @property
    def length(self) -> int:
        return self.keys.length


def causal_prefill(
    q_s: Tensor,
    k_s: Tensor,
    v: Tensor,
    block_size: int,
    sampler: LandmarkSampler,
    den_floor: float,
    capacity: int | None = None,
) -> tuple[Tensor, CausalState]:
    """The causal forward over a prompt and the state that continues it."""
    out, guards, tail = causal_forward(q_s, k_s, v, block_size, sampler, den_floor)
    state = CausalState(
        queries=GrowingBuffer(q_s, capacity) if sampler.pivot_set == "joint" else None,
        keys=GrowingBuffer(k_s, capacity),
        values=GrowingBuffer(v, capacity),
        centre=tail.centre,
        landmarks=tail.landmarks,
        moments=tail.moments,
        core=tail.landmarks.solve(tail.moments) if tail.landmarks is not None else None,
        next_draw=tail.next_draw,
        v_low=v.amin(-2, keepdim=True),
        v_high=v.amax(-2, keepdim=True),
        guards=guards,
    )
    if state.length % block_size == 0:  # the prompt ends a block: get the next one ready
        close_block(state, state.length // block_size - 1, block_size, sampler)
    return out, state


def causal_step(
    q_s: Tensor,
    k_s: Tensor,
    v: Tensor,
    state: CausalState,
    block_size: int,
    sampler: LandmarkSampler,
    den_floor: float,
) -> Tensor:
    """Row ``t = state.length`` of eq. (1) for one token q_s, k_s (..., 1, d), v (..., 1, d_v).

    O(r d + b d); the step that ends a block also folds it into the moments.
    """
    b = block_size
    block, offset = divmod(state.length, b)
    if state.queries is not None:
        state.queries.append(q_s)
    state.keys.append(k_s)
    state.values.append(v)
    state.v_low = torch.minimum(state.v_low, v)
    state.v_high = torch.maximum(state.v_high, v)
    k_local = state.keys.view(block * b)
    if block > 0:
        k_local = k_local - state.centre
    v_local = state.values.view(block * b)
    if block > 0 and state.landmarks is None:  # an exact past: every earlier key as it is
        k_local, v_local = state.keys.view() - state.centre, state.values.view()
    scores = local_scores(q_s, k_local, causal=False)  # every key here is <= t
    if block == 0 or state.landmarks is None:
        out = combine(scores, v_local, state.v_low, state.v_high, den_floor)[0]
        if block > 0:
            count_exact_rows(state.guards, out)
    else:
        past = (state.landmarks.past_logits(q_s, state.core), state.core.scaled)
        out, floored, clamped = combine(scores, v_local, state.v_low, state.v_high, den_floor, past)
        count_guards(state.guards, floored, clamped)
    if offset == b - 1:
        close_block(state, block, b, sampler)
    return out


def close_block(state: CausalState, block: int, block_size: int, sampler: LandmarkSampler) -> None:
    """Block ``block`` is complete: prepare block ``block + 1`` (fold it in, or redraw)."""
    b = block_size
    end = (block + 1) * b
    if block == 0:
        state.centre = state.keys.view(0, b).mean(-2, keepdim=True)
    if past_is_exact(block + 1, b, sampler.rank, sampler.points_per_position):
        state.landmarks = state.moments = state.core = None
        state.next_draw = block + 2
        return
    if block + 1 == state.next_draw:
        queries = state.queries.view(0, end) if state.queries is not None else None
        k_c = state.keys.view(0, end) - state.centre
        state.landmarks = LandmarkSet.draw(sampler, queries, k_c)
        state.moments = state.landmarks.moments(k_c, state.values.view(0, end))
        state.next_draw = next_draw(block + 1, b, sampler.rank, sampler.points_per_position)
    else:
        k_c = state.keys.view(block * b, end) - state.centre
        block_moments = state.landmarks.moments(k_c, state.values.view(block * b, end))
        state.moments = state.moments.merge(block_moments)
    state.core = state.landmarks.solve(state.moments)


# ----------------------------------------------------------------------------- module glue


def prefill(
    attn: CausalOptions, q: Tensor, k: Tensor, v: Tensor, capacity: int | None
) -> tuple[Tensor, CausalState]:
    out, state = causal_prefill(
        *scaled(q, k, v), attn.causal_block, sampler_of(attn), attn.den_floor, capacity
    )
    return out.to(q.dtype), state


def step(
    attn: CausalOptions, q: Tensor, k: Tensor, v: Tensor, state: CausalState
) -> tuple[Tensor, CausalState]:
    if not isinstance(state, CausalState):
        raise ValueError(f"state must be the CausalState from prefill, got {type(state).__name__}")
    out = causal_step(*scaled(q, k, v), state, attn.causal_block, sampler_of(attn), attn.den_floor)
    return out.to(q.dtype), state
