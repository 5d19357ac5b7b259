"""Why a rank-law drop-in gets worse with rank: the Nystrom normaliser on a trained head
(docs/rank_law.md, "Observations").

For one cell and one of its seeds, takes exact's first-layer q, k, v on the seed's first
test windows and, per method and rank, prints the attention output's relative error
against exact SDPA (float64; median and 90th percentile over rows) and the share of rows
on which the method's denominator guard fired (the estimated normaliser at or below its
floor: the row's output is then the guard's, not the estimate). Also the heads' logit
standard deviation (how sharp they are).

    python scripts/rank_law_guard_check.py --cell p1-n2048-d16-noise --seed-index 0
"""

from __future__ import annotations

import argparse

import torch

from rpka import paths
from rpka.attention import build
from rpka.study.dropin import swapped_model
from rpka.study.rank_law.dropin import trained_cell
from rpka.study.rank_law.grid import parse_cell

METHODS = ("rpka", "nystrom-uniform")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cell", required=True)
    parser.add_argument("--seed-index", type=int, default=0, help="member of the run, 0-3")
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--ranks", type=int, nargs="+", default=[16, 64, 128])
    parser.add_argument("--results", default=paths.RANK_LAW_RESULTS)
    args = parser.parse_args()
    cell = parse_cell(args.cell)
    trained = trained_cell(cell, args.results)
    model = swapped_model(trained.run_config, trained.state, "exact", 1, torch.float32)
    with torch.no_grad():
        q, k, v = model.attention_inputs(trained.x[:, : args.windows])[0]
    member = slice(args.seed_index * args.windows, (args.seed_index + 1) * args.windows)
    q, k, v = q[member], k[member], v[member]
    logits = q.double() @ k.double().transpose(-1, -2) / q.shape[-1] ** 0.5
    print(f"{cell.name} seed {trained.seeds[args.seed_index]}: logit sd {float(logits.std()):.2f}")
    exact = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double())
    for rank in args.ranks:
        for method in METHODS:
            attention = build(method, rank=rank, check_inputs=False,
                              generator=torch.Generator().manual_seed(0))  # fmt: skip
            with torch.no_grad():
                out = attention(q, k, v).double()
            error = ((out - exact).norm(dim=-1) / exact.norm(dim=-1)).flatten()
            p50, p90 = torch.quantile(error, torch.tensor([0.5, 0.9], dtype=error.dtype))
            share = attention.guard_shares.get("denominator", 0.0)
            print(f"  {method:>16} rank {rank:>4}: relative error median {float(p50):.3f}, "
                  f"90th percentile {float(p90):.3f}; denominator guard on {100 * share:.1f} % "
                  "of rows")  # fmt: skip


if __name__ == "__main__":
    main()
