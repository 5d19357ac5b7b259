"""Test-wide settings.

One torch thread: the suite is dominated by many small tensor operations, which run
faster and far steadier with one thread than with two threads fighting over a busy
2-core machine (the Makefile also exports OMP_NUM_THREADS=1 for the notebook kernels).
"""

import torch

torch.set_num_threads(1)
