"""rpka: residual-pivoted kernel attention - implementations and the study around them.

Importing the package (or ``rpka.attention``, ``rpka.swap``) leaves the process as it
found it: no environment variable, CPU capability or MKL branch is changed. The study's
own entry points pin the CPU numerics (``rpka.numerics.pin``): ``python -m rpka``, the
study's configuration (``rpka.config``, which its notebooks, workers and tests import
before torch runs an operation); a user may call ``rpka.numerics.pin()`` first thing.
"""

__version__ = "0.1.0"
