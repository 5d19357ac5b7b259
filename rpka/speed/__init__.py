"""Speed and memory: attention latency and peak memory against length and rank.

``scaling`` runs a latency sweep (its configuration in ``rpka.config.scaling``), ``timing``
is the interleaved forward timing harness (CPU time beside wall time, load recorded),
``analysis`` fits slopes and crossovers from the results, ``decoding`` measures per-token
decoding latency against context length.

May import: ``rpka.config`` and every stage below it (tracks, model, attention, the root
modules); nothing from training, verdict, kernel, bench, study, report or cli.
"""

from rpka import numerics

numerics.pin()  # a study stage: pinned CPU numerics before torch runs (rpka.numerics)
