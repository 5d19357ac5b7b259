"""How far back the evidence of the long-range study's task lies, and what it costs (issue 27).

    python scripts/longrange_locality.py [--preset longrange] [--out DIR] [--windows 10000]
    python scripts/longrange_locality.py --cost [--steps 3] [--probe-eval-windows 32]

Writes ``<out>/locality.json`` (default ``data/results/<preset>/``): per context of the
preset, ``rpka.tracks.lookup.locality`` of its ``forecast-lookup`` track at the local
control's window - the distance from the context's last step back to the queried payload's
last step (median, 10th / 90th percentile, mean, min, max) and the share within the window.
``--cost`` prices every context's bench with the cost model (``rpka.study.cost.predict_bench``:
a few timed steps per arm and stacked-seed count) and writes ``<out>/cost_model.json``.
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from rpka.config.presets_longctx import LONGRANGE_PRESETS
from rpka.io import write_result_json
from rpka.paths import resolve, results_dir
from rpka.study.cost import predict_bench, price, probes_of
from rpka.tracks.lookup import locality


def locality_of(preset: str, n_windows: int) -> dict:
    """The locality of every context of ``preset`` at its local control's window."""
    config = LONGRANGE_PRESETS[preset]
    out = {"preset": preset, "contexts": {}}
    for context in config.contexts:
        bench = config.bench_for(context)
        window = bench.arm(bench.local_control).options["window"]
        out["contexts"][str(context)] = locality(bench.design.track, window, n_windows)
    return out


def cost_of(preset: str, steps: int, probe_eval_windows: int | None = None) -> dict:
    """The cost model's prediction (CPU-s) of every context's bench of ``preset``.

    ``probe_eval_windows``: probe on that many validation / test windows and scale the
    measured passes (eq. (1)'s ``t_val``, ``t_test``: linear in the windows) up to the
    preset's - the probes' evaluation passes at 2,048 tokens otherwise cost minutes each.
    """
    config = LONGRANGE_PRESETS[preset]
    benches = {}
    for context in config.contexts:
        real = config.bench_for(context)
        probed = real
        if probe_eval_windows is not None:
            small = dataclasses.replace(config, eval_windows=probe_eval_windows)
            probed = small.bench_for(context)
        bench = predict_bench(probed, steps=steps, label=f"{preset}-{context}")
        if probe_eval_windows is not None:
            scale = config.eval_windows / probe_eval_windows
            probes = {
                key: dataclasses.replace(p, val_s=p.val_s * scale, test_s=p.test_s * scale)
                for key, p in probes_of(bench).items()
            }
            repriced = price(real, probes)
            for arm, entry in repriced["arms"].items():
                entry["probes"] = [dataclasses.asdict(p) for k, p in probes.items() if k[0] == arm]
            bench = {**repriced, "probe_cpu_s": bench["probe_cpu_s"]}
            bench["probe_eval_windows"] = probe_eval_windows
        benches[str(context)] = bench
        arms = {a: round(e["predicted_cpu_s"]) for a, e in bench["arms"].items()}
        print(f"{context:>5}: {bench['predicted_cpu_s']:.0f} CPU-s {arms}", flush=True)
    total = sum(b["predicted_cpu_s"] for b in benches.values())
    return {"preset": preset, "predicted_cpu_s": total, "benches": benches}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="longrange", choices=sorted(LONGRANGE_PRESETS))
    parser.add_argument("--out", default=None)
    parser.add_argument("--windows", type=int, default=10_000)
    parser.add_argument("--cost", action="store_true", help="price the benches instead")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--probe-eval-windows", type=int, default=None, help="probe on fewer, scale up"
    )
    args = parser.parse_args()
    out = resolve(args.out or results_dir(args.preset))
    torch.set_num_threads(1)
    if args.cost:
        result = cost_of(args.preset, args.steps, args.probe_eval_windows)
        print(f"total {result['predicted_cpu_s']:.0f} CPU-s")
        write_result_json(out / "cost_model.json", result)
        return
    result = locality_of(args.preset, args.windows)
    for context, entry in result["contexts"].items():
        print(
            f"{context:>5}: median {entry['median']:.0f}, p10 {entry['p10']:.0f}, p90 "
            f"{entry['p90']:.0f}, within {entry['window']}: {entry['share_within_window']:.3f}"
        )
    write_result_json(out / "locality.json", result)


if __name__ == "__main__":
    main()
