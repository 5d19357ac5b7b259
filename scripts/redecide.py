"""Re-decide a bench report written before the decision rule (no run retrained).

    PYTHONPATH=. python scripts/redecide.py data/results/full/bench_report.json

Recomputes every comparison, the attention gate and ``decision`` from the report's own
per-seed test metrics with ``rpka.verdict.decision.redecide``, using the report's configuration
with the margin and control of today's preset of the same name and track; marks the file
with ``redecided``; writes it back atomically.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rpka.config.bench import BenchConfig
from rpka.config.presets import get_preset
from rpka.io import read_json, write_result_json
from rpka.verdict.decision import redecide


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path)
    args = parser.parse_args()
    report = read_json(args.report)
    config = BenchConfig.from_dict(report["config"])
    preset = get_preset(config.preset, config.track_name)
    config = config.replace(
        margin=preset.decision.margin,
        control_arm=preset.decision.control_arm,
        gate_min_rel=preset.decision.gate_min_rel,
    )
    report["config"] = config.to_dict()
    report = redecide(report, config)
    write_result_json(args.report, report)  # a new checksum for the new verdicts
    gate = report["attention_gate"]
    print(f"{args.report}: gate {'passed' if gate and gate['passed'] else 'failed'}; verdicts:")
    for name, arm in report["arms"].items():
        if arm["comparison"]:
            print(f"  {name:<24} {arm['comparison']['verdict']}")


if __name__ == "__main__":
    main()
