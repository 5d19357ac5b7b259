"""What sets the rank RPKA needs (issue 41): a grid of long-range lookup cells, the
drop-in reading of exact's trained models at every rank, the fitted law and its held-out
prediction (docs/rank_law.md).

* :mod:`rpka.study.rank_law.grid` - the cells (pairs p, length n, head dimension d, background)
  and their training (exact and the mean-attention control, 4 seeds, each its own data);
* :mod:`rpka.study.rank_law.dropin` - per cell, RPKA, uniform landmarks and the key coreset
  swapped into exact's trained model at ranks 2, 4, 8, ...: the gap recovered per seed,
  the drop-in r*, P(RPKA better than uniform), the kernel's effective rank;
* :mod:`rpka.study.rank_law.law` - the log-linear fit r* ~ c p^a n^b d^e, the held-out check
  and ``rank_law.json``.

May import the configuration, training, bench and verdict modules; nothing imports it but
the command line and the report.
"""
