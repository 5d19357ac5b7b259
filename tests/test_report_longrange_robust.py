"""The long-range section's robustness and CPU step ratios (issue 40): "robust" / "rests on
seed s", the sign-flip interval beside the verdict, the timing file's ratios when present."""

from __future__ import annotations

from rpka.report import longrange, longrange_answer

TIMED = {"mean": 0.55, "ci_low": 0.5, "ci_high": 0.6}


def _index(timing_file):
    robustness = {
        "rpka-r16": {"robust": False, "rests_on_seeds": [105], "step_ratio_cpu": TIMED,
                     "peak_ratio_step": 1.22, "signflip_ci": {"low": -0.01, "high": 0.04}},
        "rpka-r128": {"robust": True, "rests_on_seeds": [], "step_ratio_cpu": None,
                      "signflip_ci": {"low": None, "high": None}},
    }  # fmt: skip
    verdicts = {"rpka-r16": "inconclusive", "rpka-r128": "equivalent",
                "mean-attention": "significant loss"}  # fmt: skip
    entry = {"gate_passed": True, "verdicts": verdicts, "robustness": robustness,
             "step_ratio_cpu": {"mean-attention": {"mean": 0.09, "ci_low": 0.08,
                                                   "ci_high": 0.1}}}  # fmt: skip
    entry["timing_file"] = timing_file
    return {"contexts": {"1024": entry}}


def test_the_table_names_the_seed_a_verdict_rests_on_and_reads_the_timing_file():
    table = longrange.verdicts_table(_index("longrange/steptime.json"), None, None)
    rows = table.set_index("arm")
    assert rows.loc["`rpka-r16`", "leave one seed out"] == "rests on seed 105"
    assert rows.loc["`rpka-r128`", "leave one seed out"] == "robust"
    assert rows.loc["`rpka-r16`", "CPU step (× exact) [95 % CI]"] == "0.55× [0.50, 0.60]"
    assert rows.loc["`rpka-r16`", "peak memory (× exact)"] == "1.22×"  # the timing file's too
    assert rows.loc["`mean-attention`", "CPU step (× exact) [95 % CI]"] == "0.09× [0.08, 0.10]"
    assert rows.loc["`rpka-r16`", "sign-flip interval (decides)"].startswith("[-0.01")
    assert "train step (× exact)" not in table.columns  # no wall-time ratio beside it
    assert longrange.DELTA_COLUMN not in table.columns  # no longctx.json: no t interval
    untimed = longrange.verdicts_table(_index(None), None, None)
    assert "CPU step (× exact) [95 % CI]" not in untimed.columns


def test_the_answer_waits_for_the_timing_file_then_names_n_star():
    answer = {"per_length": {"2048": {"robust_non_inferior": ["rpka-r64"], "cheapest": "rpka-r64",
                                      "step_ratio_cpu": TIMED}},
              "n_star": {"rpka": 2048, "nystrom-uniform": None}, "tie": False,
              "rule": "the rule", "untimed_lengths": []}  # fmt: skip
    text = longrange_answer.robust_answer_text({"longrange_answer": answer})
    assert "n* for RPKA: 2,048 tokens" in text and "uniform landmarks: not reached" in text
    assert "`rpka-r64` at 0.55× [0.50, 0.60]" in text
    answer["pending_lengths"] = [4096]  # a longer length still landing: n* stands
    text = longrange_answer.robust_answer_text({"longrange_answer": answer})
    assert "n* for RPKA: 2,048 tokens;" in text
    assert "uniform landmarks: not reached at the lengths read; 4,096 tokens not read yet" in text
    answer["pending_lengths"] = [1024]  # a shorter one still landing: n* is a bound
    text = longrange_answer.robust_answer_text({"longrange_answer": answer})
    assert "n* for RPKA: at most 2,048 tokens (1,024 tokens not read yet)" in text
    answer["untimed_lengths"] = [2048]
    assert "n* not decided" in longrange_answer.robust_answer_text({"longrange_answer": answer})
    assert longrange_answer.robust_answer_text({}) == ""
