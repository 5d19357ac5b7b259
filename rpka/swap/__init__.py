"""RPKA on your own model: serve any PyTorch model's SDPA calls by an approximation.

>>> from rpka.swap import swap, audit
>>> with swap("rpka", rank=32):
...     out = model(x)              # every torch SDPA call is served by RPKA
>>> table = audit(model, x, ranks=[16, 64], methods=["rpka"], metric=loss_of)

``rpka.swap.sdpa`` holds the context manager, ``rpka.swap.measure`` the per-call-site
measurement, ``rpka.swap.command`` the command line (``python -m rpka swap``). See
docs/swap.md.

May import: ``rpka.tracks`` (the example model's source), ``rpka.attention`` and the root
modules; nothing from config, training, verdict, kernel, bench, study, report or cli.
"""

from rpka.swap.measure import audit, plot_errors
from rpka.swap.sdpa import CallRecord, SDPASwap, SwapRefused, swap

__all__ = ["CallRecord", "SDPASwap", "SwapRefused", "audit", "plot_errors", "swap"]
