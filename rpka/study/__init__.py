"""The study: the steps the notebooks call and the studies run around the benches.

``steps`` is the study as the notebooks see it (their parameters per preset, each step
loading or computing its result file); ``index`` the study index (``study.json``) and the
rank frontier from the bench reports; ``notebook_params`` and ``results_check`` check the
notebooks' parameters and a study's result files. The studies beside the benches: long
context (``longctx``), the drop-in swap of exact's trained model (``dropin``), step-counted
learnability (``learnability``), the cost model (``cost``, ``cost_longctx``) and the
interleaved training-step timing (``steptime``).

May import: ``rpka.bench`` and every stage below it (kernel, training, verdict, speed, swap,
config, tracks, model, attention and the root modules); never ``rpka.report`` or
``rpka.cli``.
"""

from rpka import numerics

numerics.pin()  # a study stage: pinned CPU numerics before torch runs (rpka.numerics)
