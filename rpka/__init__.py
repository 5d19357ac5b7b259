"""rpka: residual-pivoted kernel attention - implementations and the study around them."""

__version__ = "0.1.0"
