"""Does the forecast track need attention, with or without the model's linear skip?

exact attention against the control ``mean-attention`` (uniform attention, q = 0) on the
quick preset's data and seeds at one learning rate, once with the linear context-to-horizon
skip and once without it. Prints and writes JSON (about 15 s on 2 cores):

    python scripts/forecast_attention_control.py [--out /tmp/forecast_attention_control.json]
"""

from __future__ import annotations

import argparse
import tempfile

from rpka.bench import InProcessExecutor, run_bench
from rpka.config.presets import EXACT, MEAN_CONTROL, get_preset
from rpka.io import write_json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="/tmp/forecast_attention_control.json")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for skip in (True, False):
            config = get_preset(
                "quick",
                model={"linear_skip": skip},
                arms=(EXACT, MEAN_CONTROL),
                primary_arm=MEAN_CONTROL.name,
                mechanism=None,
                learning_rates=(3e-3,),
            )
            report = run_bench(config, f"{scratch}/skip-{skip}", InProcessExecutor(), False)
            c = report["arms"][MEAN_CONTROL.name]["comparison"]
            results[f"linear_skip={skip}"] = {
                "test_mse": {arm: e["full"]["mean"] for arm, e in report["arms"].items()},
                "delta_mean_minus_exact": c["delta_mean"],
                "ci": [c["ci_low"], c["ci_high"]],
                "sign_flip_p": c["p_value"],
                "n_pairs": c["n_pairs"],
            }
            print(f"linear_skip={skip}: {results[f'linear_skip={skip}']}")
    write_json(args.out, results)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
