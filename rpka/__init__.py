"""rpka: residual-pivoted kernel attention - implementations and the study around them."""

from rpka import numerics

# Before anything imports torch or numba: the same float results on any AVX2 CPU
# (rpka.numerics; RPKA_NUMERICS=native opts out).
numerics.pin()

__version__ = "0.1.0"
