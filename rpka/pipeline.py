"""The main job: ``python -m rpka report --preset {smoke,quick,full}``.

The notebook pipeline (papermill + nbconvert) is not built yet. Until it is, this runs
what exists - the CPU attention-latency benchmark - and says so.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from rpka import scaling

PRESETS = ("smoke", "quick", "full")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rpka report")
    parser.add_argument("--preset", choices=PRESETS, default="full")
    args = parser.parse_args(argv)
    lengths = {"smoke": ["256", "1024"], "quick": ["256", "1024", "4096"]}.get(
        args.preset, ["256", "1024", "4096", "8192"]
    )
    out = f"data/results/scaling/latency_cpu_{args.preset}.json"
    print("The notebook report is not built yet; running the CPU latency benchmark instead.")
    scaling.main(
        ["--lengths", *lengths, "--ranks", "16", "64", "--control-ranks", "--no-backward"]
        + ["--no-memory", "--out", out]
    )
