"""Training: one run from its configuration to its weights.

``run_config`` turns a bench's configuration into one run's (its run id and derived seeds);
``seed_data`` draws each seed's data, paired across arms; ``curriculum`` the warm start (a
shorter context first, positions stretched); ``train`` one training run, a pure function;
``trained`` a finished run's weights, checked, and its model; ``executors`` where a bench's
jobs run (a local pool, inline or Dask).

May import: ``rpka.config`` and every stage below it (tracks, model, attention, the root
modules); nothing from verdict, speed, swap, kernel, bench, study, report or cli.
"""

from rpka import numerics

numerics.pin()  # a study stage: pinned CPU numerics before torch runs (rpka.numerics)
