"""The price of a long-context study per length, the curriculum's first stages included
(issue 40, ``rpka.study.cost_longctx``)."""

from __future__ import annotations

import pytest

from rpka.bench import job_groups
from rpka.config.presets_longctx import LONGCTX_PRESETS
from rpka.study.cost import Probe
from rpka.study.cost_longctx import first_stage_s, price_context, price_longctx

SMOKE = LONGCTX_PRESETS["longrange-power-smoke"]


def _probes(bench, step_s: float) -> dict[tuple[str, int], Probe]:
    return {
        (g.arm, g.members): Probe(g.members, 2, setup_s=1.0, step_s=step_s, val_s=0.5, test_s=0.7)
        for g in job_groups(bench)
    }


def test_each_job_pays_its_first_stage_without_a_test_pass():
    bench = SMOKE.bench_for(80)
    own, warm = _probes(bench, 0.1), _probes(bench, 0.01)
    priced = price_context(SMOKE, 80, own, warm)
    groups = job_groups(bench)
    n_jobs = sum(g.jobs for g in groups)
    n_eval = sum(g.jobs for g in groups if g.phase == "eval")
    own_s = n_jobs * (1.0 + 2 * 0.1 + 0.5) + n_eval * 0.7  # eq. (1), one epoch
    first_s = n_jobs * (1.0 + 2 * 0.01 + 0.5)  # validation only: no test pass
    assert priced["first_stage_cpu_s"] == pytest.approx(first_s)
    assert priced["predicted_cpu_s"] == pytest.approx(own_s + first_s)
    assert sum(first_stage_s(bench, warm).values()) == pytest.approx(first_s)
    cold = price_context(SMOKE, 80, own, None)
    assert cold["predicted_cpu_s"] == pytest.approx(own_s) and cold["first_stage_cpu_s"] == 0


def test_probe_eval_windows_must_fit_the_study(tmp_path):
    with pytest.raises(ValueError, match="probe_eval_windows"):
        price_longctx(SMOKE, tmp_path, probe_eval_windows=SMOKE.eval_windows + 1)
