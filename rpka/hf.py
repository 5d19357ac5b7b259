"""RPKA as a Hugging Face attention implementation (issue 52, item 5).

>>> import rpka.hf
>>> name = rpka.hf.register("rpka", method="rpka", rank=64)     # once per process
>>> model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=name)
>>> model.set_attn_implementation(name)                         # or on a loaded model
>>> rpka.hf.registration(name).served                           # calls served so far

:func:`register` adds two functions to transformers' global registries under ``name``:

* an attention function in ``AttentionInterface`` (the signature of transformers'
  ``sdpa_attention_forward``): q (B, H, L, E), k, v (B, H_kv, S, E) -> (B, L, H, Ev),
  GQA from the module's ``num_key_value_groups``, ``scaling`` folded into q, served by
  the method of ``rpka.attention`` (``rpka.attention.masks`` for padding);
* a mask function in ``AttentionMaskInterface``: the model's ``create_causal_mask`` /
  ``create_bidirectional_mask`` then hand the attention function the padding as a key
  mask planned once per forward (:class:`rpka.attention.masks.PrefixMask`: keep (B, S) and
  the keys each query sees), never an L x S tensor. Masks of another pattern (sliding
  windows, packed sequences, image overlays) are built densely by transformers'
  ``sdpa_mask`` and read by :func:`rpka.attention.masks.from_mask`: served if they are
  key padding (+ causal), refused otherwise.

Full rank means exact, as in ``rpka.swap``: a call (or a padded call's part) on at most
``rank`` kept keys runs exact attention on them (torch SDPA), counted as served.

What runs: prefill with left or right padding - causal RPKA on the real tokens (a
decoder), non-causal on every kept key (an encoder); a cached decode step (L = 1) - the
method's non-causal form on the query and every kept cached key (no decoding state is
kept between steps: each step draws its landmarks afresh, O(S r d) where exact attention
costs O(S d)). Fully masked rows (a left-padded query) return 0, as SDPA's boolean mask
does. A call that cannot be served (dropout > 0 in training, ``softcap``, a
``position_bias``, attention sinks, a mask of another form, a causal call to a method
without a causal form) raises ``rpka.swap.SwapRefused`` with one line, or with
``fallback="exact"`` runs transformers' ``sdpa_attention_forward`` and is counted.

transformers is an optional dependency (``pip install -e .[hf]``): this module imports it
(an ImportError naming the extra without it); ``import rpka`` does not import this module.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rpka.attention import masks, options_of
from rpka.swap.sdpa import FALLBACKS, SwapRefused, method_forms

try:  # the optional extra hf; `import rpka` never comes here
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import (
        AttentionMaskInterface,
        bidirectional_mask_function,
        causal_mask_function,
        prepare_padding_mask,
        sdpa_mask,
    )
except ImportError as err:
    raise ImportError("rpka.hf needs transformers >= 5: pip install -e .[hf]") from err

# the names transformers itself registers: never replaced
RESERVED = ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3")
HALF = (torch.float16, torch.bfloat16)  # computed in float32, returned in the input dtype
UNSERVED_KWARGS = ("softcap", "position_bias", "s_aux", "sinks")


class HFAttention:
    """The attention and mask functions registered under one name, and their counts.

    Attributes:
        served, passed: calls served by the method, calls run by transformers' SDPA
            (``fallback="exact"``).
        reasons: why calls were passed, with their counts.
    """

    def __init__(self, name: str, method: str, rank: int, fallback: str, **options: Any) -> None:
        if fallback not in FALLBACKS:
            raise ValueError(f"fallback must be one of {FALLBACKS}, got {fallback!r}")
        takes = options_of(method)  # unknown method: ValueError naming the valid ones
        if "causal" in options:
            raise ValueError("causal is not an option here: each call's mask chooses it")
        self.name, self.method, self.rank, self.fallback = name, method, rank, fallback
        self.options = {**({"rank": rank} if "rank" in takes else {}), **options}
        self.modules, self.causal_reason = method_forms(method, self.options)
        self.served = self.passed = 0
        self.reasons: Counter[str] = Counter()

    # ------------------------------------------------------------------ the mask function

    def mask(
        self,
        batch_size: int,
        q_length: int,
        kv_length: int,
        q_offset: int | Tensor = 0,
        kv_offset: int = 0,
        mask_function: Callable | None = None,
        attention_mask: Tensor | None = None,
        **kwargs: Any,
    ) -> masks.PrefixMask | Tensor | None:
        """transformers' mask interface (``sdpa_mask``'s arguments): causal or
        bidirectional masks with padding become a planned key mask; other patterns the
        dense boolean mask of ``sdpa_mask`` (read by the attention function)."""
        if isinstance(attention_mask, masks.PrefixMask):
            # planned already: generate with a static cache prepares the mask before the
            # forward (create_masks_for_generate), which hands it here again
            return attention_mask
        dense = {
            "batch_size": batch_size,
            "q_length": q_length,
            "kv_length": kv_length,
            "q_offset": q_offset,
            "kv_offset": kv_offset,
            "mask_function": mask_function,
            "attention_mask": attention_mask,
            **kwargs,
        }
        if mask_function not in (causal_mask_function, bidirectional_mask_function):
            return sdpa_mask(**dense)
        device = kwargs.get("device", "cpu")
        padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
        if padding is None:
            keep = torch.ones(batch_size, kv_length, dtype=torch.bool, device=device)
        else:
            keep = padding[:, kv_offset : kv_offset + kv_length].to(device, torch.bool)
            keep = keep.expand(batch_size, kv_length)
        # query i sits at position q_offset + i, key j at kv_offset + j (the cache's frame)
        offset = int(q_offset) - int(kv_offset)
        try:
            return masks.from_padding(keep, q_length, mask_function is causal_mask_function, offset)
        except masks.MaskRefused:  # a chunk of queries after a cache: the attention refuses it
            return sdpa_mask(**dense)

    # ------------------------------------------------------------ the attention function

    def attention(
        self,
        module: nn.Module,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: masks.PrefixMask | Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        is_causal: bool | None = None,
        **kwargs: Any,
    ) -> tuple[Tensor, None]:
        """transformers' attention interface: q (B, H, L, E), k, v (B, H_kv, S, E) ->
        (B, L, H, Ev) and no attention weights."""
        groups = getattr(module, "num_key_value_groups", 1)
        key, value = (x.repeat_interleave(groups, 1) if groups > 1 else x for x in (key, value))
        keys = key.shape[-2]
        if attention_mask is None:  # no mask built: the module's own causality
            attention_mask = self._unmasked(module, query, keys, is_causal)
        plan, reason = self._plan(query, attention_mask, dropout, kwargs)
        if reason is not None:
            return self._pass(
                module, query, key, value, plan, attention_mask, reason, dropout, scaling, kwargs
            )
        rest = 1.0 if scaling is None else scaling * math.sqrt(query.shape[-1])
        if rest != 1.0:  # the methods use 1 / sqrt(E): fold the rest into q (GPT-2's is 1)
            query = query * rest
        dtype = query.dtype
        q, k, v = (x.float() if dtype in HALF else x for x in (query, key, value))
        out = self._attend(q, k, v, plan).to(dtype)
        self.served += 1
        return out.transpose(1, 2).contiguous(), None

    @staticmethod
    def _unmasked(
        module: nn.Module, query: Tensor, keys: int, is_causal: bool | None
    ) -> masks.PrefixMask | Tensor:
        """The plan of a call without a mask: causal (the module's ``is_causal``, the last L
        of S positions, as transformers aligns them) or not; the dense causal mask where
        it cannot be planned (then read and refused)."""
        length = query.shape[-2]
        causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", 0))
        keep = torch.ones(query.shape[0], keys, dtype=torch.bool, device=query.device)
        try:
            return masks.from_padding(keep, length, causal and length > 1, keys - length)
        except masks.MaskRefused:
            ones = torch.ones(length, keys, dtype=torch.bool, device=query.device)
            return ones.tril(keys - length)[None, None]

    def _plan(
        self, query: Tensor, mask: masks.PrefixMask | Tensor, dropout: float, kwargs: dict
    ) -> tuple[masks.PrefixMask | None, str | None]:
        """The planned mask (None: a dense mask that could not be read) and why the call
        cannot be served (None: it can)."""
        if isinstance(mask, Tensor):
            try:
                plan = masks.from_mask(mask, tuple(query.shape), mask.shape[-1])
            except masks.MaskRefused as err:
                return None, f"attention_mask {tuple(mask.shape)}: {err}"
            if plan is None:  # masks nothing
                keep = torch.ones(query.shape[0], mask.shape[-1], dtype=torch.bool)
                plan = masks.from_padding(keep.to(query.device), query.shape[-2], False)
        else:
            plan = mask
        if dropout > 0:
            return plan, f"dropout={dropout} (dropout on attention weights: set model.eval())"
        for name in UNSERVED_KWARGS:
            if kwargs.get(name) is not None:
                return plan, f"{name} (not served)"
        if plan.causal and self.causal_reason is not None:
            return plan, f"a causal mask ({self.causal_reason})"
        return plan, None

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, plan: masks.PrefixMask) -> Tensor:
        """The method on the kept keys; a call on at most ``rank`` of them is exact
        attention (full rank means exact, as in ``rpka.swap``)."""
        length, keys = q.shape[-2], k.shape[-2]
        rank = self.options.get("rank", 0)
        whole = len(plan.groups) == 1 and plan.groups[0].members.numel() == q.shape[0]
        causal = whole and plan.plain_causal(length, keys)
        if whole and (causal or plan.unmasked(keys)):  # no padding: the call as it is
            if keys <= rank:  # every key a landmark
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            return self.modules[causal](q, k, v)
        return masks.attend(self._method, q, k, v, plan, rank)

    def _method(self, q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
        return self.modules[causal](q, k, v)

    def _pass(
        self,
        module: nn.Module,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        plan: masks.PrefixMask | None,
        mask: masks.PrefixMask | Tensor,
        reason: str,
        dropout: float,
        scaling: float | None,
        kwargs: dict,
    ) -> tuple[Tensor, None]:
        """Refuse (``fallback="error"``) or run transformers' SDPA on the dense mask."""
        if self.fallback == "error":
            raise SwapRefused(
                f"rpka.hf({self.name!r}, method {self.method!r}) cannot serve the attention "
                f"call of {type(module).__name__}: {reason}; register with fallback='exact' "
                "to run such calls exactly (counted as not served)"
            )
        dense = mask if isinstance(mask, Tensor) else plan.dense()
        self.passed += 1
        self.reasons[reason.split(" (")[0]] += 1
        heads = query.shape[1]  # k, v already carry the query heads (GQA repeated)
        fake = _NoGroups(getattr(module, "is_causal", False), heads)
        return sdpa_attention_forward(
            fake, query, key, value, dense, dropout=dropout, scaling=scaling, **kwargs
        )


class _NoGroups(nn.Module):
    """The module transformers' SDPA sees on a passed call: k, v are already repeated."""

    def __init__(self, is_causal: bool, heads: int) -> None:
        super().__init__()
        self.is_causal, self.num_key_value_groups, self.heads = is_causal, 1, heads


_REGISTERED: dict[str, HFAttention] = {}


def register(name: str = "rpka", method: str = "rpka", rank: int = 64, **options: Any) -> str:
    """Register ``method`` at ``rank`` (with the method's ``options`` and ``fallback=``
    ``"error"`` or ``"exact"``) as the attention implementation ``name`` in transformers'
    ``AttentionInterface`` and ``AttentionMaskInterface``; returns ``name``, to pass to
    ``from_pretrained(..., attn_implementation=name)`` or ``model.set_attn_implementation``.

    Registering a name again replaces its method (models already set to it use the new
    one). Bad options raise ``ValueError`` now, before any model runs.
    """
    if not isinstance(name, str) or not name or name in RESERVED or name.startswith("paged"):
        raise ValueError(f"name must be a new attention implementation name, got {name!r}")
    fallback = options.pop("fallback", "error")
    attention = HFAttention(name, method, rank, fallback, **options)
    AttentionInterface.register(name, attention.attention)
    AttentionMaskInterface.register(name, attention.mask)
    _REGISTERED[name] = attention
    return name


def registration(name: str) -> HFAttention:
    """The :class:`HFAttention` registered under ``name`` (its counts: ``served``,
    ``passed``, ``reasons``)."""
    if name not in _REGISTERED:
        raise KeyError(
            f"no rpka attention registered as {name!r}; registered: {sorted(_REGISTERED)}"
        )
    return _REGISTERED[name]
