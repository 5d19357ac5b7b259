"""The trace identity's z-scores on the committed study's trained heads, over Monte Carlo
seeds: is the committed run's over-dispersion a property of the heads or of its seed?

Re-runs ``rpka.mechanism.trace_identity`` on the same points as the committed
``mechanism.json`` (primary arm, first evaluation seed, 4 test windows, every layer and
head) with the study's options but the explicit candidate decreases (the same values to
round-off, much faster), for several seeds; writes the variance of the z-scores per seed
and pooled (1 if they are standard normal), with a chi-square p of the pooled sum of
squares. About 20 s per seed on 2 cores:

    python scripts/trace_identity_seeds.py [--seeds 0 1 2 3 4] \
        [--out data/results/full/trace_identity_seeds.json]
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np
import torch
from scipy import stats

from rpka.bench import load_trained
from rpka.io import read_json, write_json
from rpka.mechanism import MechanismConfig, pivot_points, trace_identity
from rpka.presets import get_preset
from rpka.tracks import get_task, get_track

N_WINDOWS = 4  # the test windows the bench's mechanism study feeds (rpka.bench)


def trained_points(results: Path) -> torch.Tensor:
    """(layers * heads, N, d): the pivot points of the committed mechanism study."""
    report = read_json(results / "bench_report.json")
    primary = report["arms"][report["primary_arm"]]
    model, _ = load_trained(results / "runs" / f"{primary['run_ids'][0]}.json")
    config = get_preset(report["config"]["preset"])
    track = get_track("forecast", config.track, "data/cache")
    x = get_task("forecast").inputs_targets(track, "test")[0][:N_WINDOWS]
    qkv = model.attention_inputs(x.expand(model.n_members, *x.shape))
    item = MechanismConfig().identity_item
    return torch.stack(
        [
            pivot_points(q[item, head], k[item, head])
            for q, k, _ in qkv
            for head in range(q.shape[1])
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--results", type=Path, default=Path("data/results/full"))
    parser.add_argument(
        "--out", type=Path, default=Path("data/results/full/trace_identity_seeds.json")
    )
    args = parser.parse_args()
    points = trained_points(args.results)
    study = get_preset(read_json(args.results / "bench_report.json")["config"]["preset"])
    base = MechanismConfig(
        **{**(study.mechanism or {}), "candidate_decreases": "explicit", "monte_carlo": "resample"}
    )
    per_seed, pooled = [], []
    for seed in args.seeds:
        out = trace_identity(points, dataclasses.replace(base, seed=seed))
        z = out["z"][np.isfinite(out["z"])]
        pooled.append(z)
        per_seed.append({"seed": seed, "n_tests": int(z.size), "z_variance": float(z.var())})
        print(per_seed[-1], flush=True)
    z = np.concatenate(pooled)
    result = {
        "what": "variance of the trace identity's z-scores (1 if standard normal) on the "
        "committed trained heads, per Monte Carlo seed and pooled",
        "command": "python scripts/trace_identity_seeds.py",
        "rank": base.rank,
        "draws": base.draws,
        "per_seed": per_seed,
        "pooled_z_variance": float(z.var()),
        "pooled_n_tests": int(z.size),
        "pooled_chi2_p_value": float(stats.chi2.sf(float((z**2).sum()), z.size)),
    }
    write_json(args.out, result)
    print(
        f"pooled variance {result['pooled_z_variance']:.3f} over {z.size} z-scores, "
        f"chi-square p {result['pooled_chi2_p_value']:.3g}; written to {args.out}"
    )


if __name__ == "__main__":
    main()
