"""The kernel studies: what RPKA's pivoted kernel is on trained heads.

``matrix`` builds the matrix RPKA pivots (A_tau from q, k), its Schur steps and eigenvalue
tails; ``mechanism`` checks the trace identity of RPCholesky on trained heads; ``quality``
measures each method's approximation error of exact attention; ``leakage`` checks that
output t reads no input after t; ``spectrum`` the kernel spectrum of exact's trained heads
(why a high rank).

May import: ``rpka.training`` and ``rpka.verdict`` (a trained run, the frontier's gap) and
every stage below them (config, tracks, model, attention, the root modules); never the
bench, the study, the report or the command line.
"""

from rpka import numerics

numerics.pin()  # a study stage: pinned CPU numerics before torch runs (rpka.numerics)
