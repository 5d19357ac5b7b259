"""Test-wide settings and shared fixtures.

One torch thread: the suite is dominated by many small tensor operations, which run
faster and far steadier with one thread than with two threads fighting over a busy
2-core machine (the Makefile also exports OMP_NUM_THREADS=1 for the notebook kernels).
"""

from rpka import numerics

numerics.pin()  # the tests compare committed numbers: pinned, before torch loads

import pytest  # noqa: E402
import torch  # noqa: E402

from rpka.bench import InProcessExecutor, run_bench  # noqa: E402
from rpka.config.presets import get_preset  # noqa: E402

torch.set_num_threads(1)

# the full study's structure in miniature: ablation reference, ablations, peers
SMOKE_STUDY = get_preset("smoke-study", train={"epochs": 1})


@pytest.fixture(scope="session")
def smoke_study_report(tmp_path_factory):
    """(report, out folder) of one smoke-study bench, shared by the test modules."""
    root = tmp_path_factory.mktemp("smoke_study")
    report = run_bench(
        SMOKE_STUDY, root / "out", InProcessExecutor(), progress=False, data_dir=root / "cache"
    )
    return report, root / "out"
