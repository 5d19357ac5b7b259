"""Configuration: what a study is, before anything runs, and the named presets.

``bench`` holds a study's configuration (``BenchConfig``: its four concerns, one flat form
on disk) and the long-context study's (``LongContextConfig``); ``concerns`` the design,
decision rule, studies and execution, each validating itself; ``parts`` training, an arm and
the mechanism study's options; ``scaling`` a latency sweep's configuration. The named
presets: ``presets_tracks`` (each track's), ``presets`` (the named studies, ``get_preset``)
and ``presets_longctx`` (the long-context studies).

May import: ``rpka.tracks``, ``rpka.model``, ``rpka.attention`` and the root modules (io,
paths, checks, numerics); nothing from the stages above.
"""

from rpka import numerics

numerics.pin()  # a study stage: pinned CPU numerics before torch runs (rpka.numerics)
