"""Re-decide a bench report written before the decision rule (no run retrained).

    PYTHONPATH=. python scripts/redecide.py data/results/full/bench_report.json
    PYTHONPATH=. python scripts/redecide.py --own-config data/results/full/recall/bench_report.json

Recomputes every comparison, the attention gate and ``decision`` from the report's own
per-seed test metrics with ``rpka.verdict.decision.redecide``, using the report's configuration
with the margin and control of today's preset of the same name and track; marks the file
with ``redecided``; writes it back atomically. ``--own-config``: the file's own
configuration as it is (margin, control, arms), so that only what today's statistics give
for the same rule changes - e.g. a verdict written before ``rpka.stats`` read zero-variance
differences (a positive control, exact by construction) as the t-tests' limit, which
``rpka.verdict.consistency`` finds and the report then refuses (issue 56).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rpka.config.bench import BenchConfig
from rpka.config.presets import get_preset
from rpka.io import read_json, write_result_json
from rpka.verdict.decision import compare_arms, redecide


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--own-config", action="store_true", help="keep the file's config")
    args = parser.parse_args()
    report = read_json(args.report)
    config = BenchConfig.from_dict(report["config"])
    if args.own_config:
        gate = compare_arms(config, report["arms"])
        report["attention_gate"] = gate
        report["comparison"] = report["arms"][config.decision.primary_arm]["comparison"]
        report["redecided"] = (
            "comparisons and gate recomputed by rpka.verdict.decision.compare_arms from the "
            "per-seed test metrics and the configuration of this file (no run retrained)"
        )
        write_result_json(args.report, report)
        _print(args.report, report)
        return
    preset = get_preset(config.preset, config.track_name)
    config = config.replace(
        margin=preset.decision.margin,
        control_arm=preset.decision.control_arm,
        gate_min_rel=preset.decision.gate_min_rel,
    )
    report["config"] = config.to_dict()
    report = redecide(report, config)
    write_result_json(args.report, report)  # a new checksum for the new verdicts
    _print(args.report, report)


def _print(path: Path, report: dict) -> None:
    gate = report["attention_gate"]
    print(f"{path}: gate {'passed' if gate and gate['passed'] else 'failed'}; verdicts:")
    for name, arm in report["arms"].items():
        if arm["comparison"]:
            print(f"  {name:<24} {arm['comparison']['verdict']}")


if __name__ == "__main__":
    main()
