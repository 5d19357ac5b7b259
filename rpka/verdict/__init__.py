"""The verdict: from per-seed results to a decision, one bench or across tracks.

``significance`` holds the tests (sign-flip p, the rule's MDE, Holm, TOST); ``stats`` the
per-arm summaries and paired comparisons; ``decision`` the verdict decided in one place (the
margins, the "cheaper" thresholds, the verdict words, the gates, the rule applied to one
bench; docs/statistics.md); ``robustness`` the leave-one-seed-out verdicts and the sign-flip
interval; ``ablations`` chooses RPKA's default on validation; ``frontier`` the rank
frontier (gap recovered, r*); ``aggregate`` the view across tracks after rliable.

May import: ``rpka.config`` and every stage below it (tracks, model, attention, the root
modules); nothing from training, speed, swap, kernel, bench, study, report or cli.
"""
