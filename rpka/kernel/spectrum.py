"""Why RPKA needs a high rank on sharp heads: the kernel it approximates is close to full rank.

RPKA approximates the Gaussian kernel matrix ``G`` of the pivoted points (the joint set
``[q~; k~]``, balanced and centred as RPKA pivots them, :func:`rpka.kernel_matrix.pivot_points`)
and not the attention matrix ``P = softmax(q k^T / sqrt(d))`` itself. Per head, for ranks r:

* ``residual_rpc`` / ``residual_uniform``: the normalised residual trace
  ``tr(G - G_S) / tr(G)`` after r RPCholesky (rule ``rpc``, weighting ``gauss``: RPKA's
  default) or uniform pivots, mean over Monte Carlo draws;
* ``residual_optimal``: the same for the best rank-r approximation (the eigenvalues of G
  beyond the r largest, over their sum) - no pivoting rule can do better;
* ``no_structure``: ``1 - r / N``, what every pivot removing exactly one unit of trace
  leaves (N points, unit diagonal): a kernel with no low-rank structure at all;
* ``attention_error``: the relative Frobenius error of the best rank-r approximation of P
  (its singular values beyond the r largest) - how low-rank the thing users want is;
* ``logit_std``: the standard deviation of ``q.k / sqrt(d)`` (how sharp the head is);
* ``qk_norm_ratio``: the largest query norm over the largest centred key norm (how lopsided
  the head is; full rank is exact whatever it is, docs/numerics.md).

On sharp heads the residual of G follows ``1 - r/N`` for RPCholesky, uniform landmarks and
the optimum alike while P is already well approximated: the estimator spends its rank on
a kernel that has no structure to find.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rpka.attention.rpcholesky import gaussian_kernel, rpcholesky
from rpka.io import read_json, read_run_file, write_result_json
from rpka.kernel.matrix import pivot_points
from rpka.tracks import get_task
from rpka.training.train import build_model, track_config_of
from rpka.training.trained import load_run_state
from rpka.verdict.frontier import causal_block_of

SPECTRUM_RANKS = (4, 8, 16, 32, 64, 96, 128)
# what a head's row holds, averaged over the inputs
HEAD_CURVES = ("logit_std", "qk_norm_ratio", "residual_rpc", "residual_uniform",
               "residual_optimal", "no_structure", "attention_error")  # fmt: skip


def qk_norm_ratio(q: Tensor, k: Tensor) -> Tensor:
    """The largest query norm over the largest centred key norm: q (..., n, d), k (..., m, d)
    -> (...). How lopsided a head is (RPKA's q/k balance undoes it, docs/numerics.md)."""
    q, k = q.double(), k.double()
    k_centred = k - k.mean(-2, keepdim=True)
    return q.norm(dim=-1).amax(-1) / k_centred.norm(dim=-1).amax(-1)


def head_spectrum(
    q: Tensor,
    k: Tensor,
    ranks: Sequence[int],
    draws: int = 4,
    seed: int = 0,
    causal: bool = False,
) -> dict[str, Any]:
    """The curves of the module docstring for one head: q (n, d), k (m, d) -> dict of lists
    over ``ranks`` (ranks above the number of points are dropped). ``causal``: P is the
    causally masked softmax (the kernel is that of every point of the sequence, the pool of
    its last block's past and more)."""
    q, k = q.detach().double(), k.detach().double()
    points = pivot_points(q.unsqueeze(0), k.unsqueeze(0))[0]  # (N, d), RPKA's frame
    n_points = points.shape[0]
    ranks = [r for r in ranks if 1 <= r <= n_points]
    gram = gaussian_kernel(points, points)
    eigen = torch.linalg.eigvalsh(gram).flip(0).clamp(min=0)  # descending
    total = float(eigen.sum())
    tail = eigen.flip(0).cumsum(0).flip(0)  # tail[i] = sum of eigenvalues from i on
    logits = q @ k.T / q.shape[-1] ** 0.5
    masked = logits
    if causal:
        future = torch.ones_like(logits, dtype=torch.bool).triu(1)
        masked = logits.masked_fill(future, float("-inf"))
    sv = torch.linalg.svdvals(torch.softmax(masked, -1))
    sv_tail = (sv.square().flip(0).cumsum(0).flip(0)).sqrt()  # Frobenius of the rest
    qk_ratio = float(qk_norm_ratio(q, k))
    out: dict[str, Any] = {"n_points": n_points, "ranks": ranks,
                           "logit_std": float(logits.std()), "qk_norm_ratio": qk_ratio}  # fmt: skip
    for rule in ("rpc", "uniform"):
        curves = []
        for draw in range(draws):
            generator = torch.Generator().manual_seed(seed + draw)
            result = rpcholesky(points, max(ranks), rule, generator, weighting="gauss")
            curves.append((result.trace / result.trace[..., :1]).numpy())
        mean = np.mean(curves, axis=0)
        out[f"residual_{rule}"] = [float(mean[r]) for r in ranks]
    out["residual_optimal"] = [float(tail[r]) / total if r < n_points else 0.0 for r in ranks]
    out["no_structure"] = [1 - r / n_points for r in ranks]
    out["attention_error"] = [float(sv_tail[r] / sv_tail[0]) if r < len(sv) else 0.0 for r in ranks]
    return out


def model_spectrum(
    qkv_per_layer: Sequence[tuple[Tensor, Tensor, Tensor]],
    ranks: Sequence[int],
    items: int = 2,
    draws: int = 4,
    causal: bool = False,
) -> list[dict[str, Any]]:
    """:func:`head_spectrum` of every (layer, head) over the first ``items`` inputs, the
    curves averaged over the items. qkv per layer: (items, heads, n, d) each."""
    rows = []
    for layer, (q, k, _) in enumerate(qkv_per_layer):
        for head in range(q.shape[1]):
            per_item = [head_spectrum(q[i, head], k[i, head], ranks, draws, 100 * i, causal)
                        for i in range(min(items, q.shape[0]))]  # fmt: skip
            row: dict[str, Any] = {"layer": layer, "head": head,
                                   "n_points": per_item[0]["n_points"],
                                   "ranks": per_item[0]["ranks"]}  # fmt: skip
            for key in HEAD_CURVES:
                row[key] = np.mean([p[key] for p in per_item], axis=0).tolist()
            rows.append(row)
    return rows


def bench_spectrum(
    bench_dir: str | Path, ranks: Sequence[int] = SPECTRUM_RANKS, items: int = 2, draws: int = 4
) -> dict[str, Any]:
    """:func:`model_spectrum` of exact attention's trained model in a finished bench (its
    first evaluation run, member 0, the weights saved beside the run file), on the first
    ``items`` test inputs; written to ``<bench_dir>/spectrum.json`` and returned."""
    bench_dir = Path(bench_dir)
    report = read_json(bench_dir / "bench_report.json")
    run_file = bench_dir / "runs" / f"{report['arms'][report['baseline_arm']]['run_ids'][0]}.json"
    run = read_run_file(run_file)
    run_config = {**run["config"], "device": "cpu"}
    track_config = track_config_of(run_config)
    model = build_model(run_config, track_config, torch.device("cpu"))
    model.load_state_dict(load_run_state(run_file, run))  # the weights the run saved, checked
    model = model.double().eval()
    task = get_task(report["track"])
    x, _ = task.inputs_targets(task.load(track_config, run_config.get("data_dir")), "test")
    first = x[:items].double() if x.is_floating_point() else x[:items]
    with torch.no_grad():
        stacked = model.attention_inputs(first.expand(model.n_members, *first.shape))
    qkv = [tuple(t[: len(first)] for t in layer) for layer in stacked]  # member 0
    causal = causal_block_of(report) is not None
    result = {
        "what": __doc__.split("\n\n")[0],
        "track": report["track"],
        "run_file": str(run_file),
        "items": len(first),
        "draws": draws,
        "causal": causal,
        "heads": model_spectrum(qkv, ranks, items, draws, causal),
    }
    write_result_json(bench_dir / "spectrum.json", result)
    return result
