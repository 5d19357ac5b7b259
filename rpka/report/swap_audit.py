"""The report's section on RPKA in a model that is not the project's (issue 42): the
``rpka.swap`` audit of the example model, read from its result file
(``rpka.paths.swap_audit_json``, written by the study's stage ``rpka.swap.stage``) and
drawn here - error against rank per call site. Without the file, one line says the audit
was not run (a report from results that predate it)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import pandas as pd
from IPython.display import Markdown

from rpka.swap import plot_errors

USE = (
    "Any PyTorch model whose attention goes through `torch.nn.functional."
    "scaled_dot_product_attention` runs on RPKA without an edit inside "
    '`with rpka.swap.swap("rpka", rank=...)`, and `rpka.swap.audit` measures what that costs '
    "per call site. The guide is `docs/swap.md` in the repository (the SDPA arguments served "
    "and refused, the audit's columns, the command line `python -m rpka swap`); the "
    "walk-through is `notebooks/07_your_model.ipynb`, whose executed copy lies beside this "
    "report."
)
COLUMNS = ["rank", "site", "swapped", "output_error", "logit_std", "rho", "predicted_rank",
           "error_at_predicted", "metric", "metric_change"]  # fmt: skip


def swap_text(audit_file: Mapping[str, Any] | None, path: str | os.PathLike) -> str:
    """The section's words: the use, then the audited model and its training, or that the
    audit was not run (``path``: where its file would be)."""
    if not audit_file:
        return f"{USE}\n\nThe audit was not run for this study (`{path}` is not there)."
    config, training = audit_file["config"], audit_file["training"]
    return (
        f"{USE}\n\nThe audit here: {config['model']}, trained {training['steps']} steps on "
        f"the project's `lm` source (training loss {training['first_loss']:.2f} -> "
        f"{training['final_loss']:.2f} nats), audited on {config['eval_sequences']} test "
        f"sequences at ranks {', '.join(map(str, config['ranks']))} (causal RPKA, block "
        f"{config['causal_block']}); the end metric is the {config['metric']}."
        + _law_text(audit_file)
    )


def _law_text(audit_file: Mapping[str, Any]) -> str:
    """What the rank law's columns are, where the file has them."""
    law = audit_file.get("law") or {}
    if law.get("eps") is None:
        return ""
    return (
        f" Beside each site's error: its logit scale ρ, the rank the fitted rank law "
        f"predicts for an output error {law['eps']:g} (`rpka.rank_law.predict_rank`, the "
        "largest over the site's heads) and the error measured at that rank."
    )


def swap_table(audit_file: Mapping[str, Any]) -> pd.DataFrame:
    """The audit's rows, one per (method, rank, call site), the columns the report shows."""
    table = pd.DataFrame(audit_file["rows"])
    shown = [c for c in ["method", *COLUMNS] if c in table.columns]
    return table[shown]


def swap_caption(audit_file: Mapping[str, Any]) -> tuple[str, str]:
    """(caption, alt text) of the error-against-rank figure."""
    table = pd.DataFrame(audit_file["rows"])
    top = table.loc[table["rank"] == table["rank"].max(), "output_error"].max()
    caption = (
        "RPKA swapped into a model that is not the project's: the attention output's "
        "relative error against exact attention, per call site, falls with the rank "
        f"(at rank {table['rank'].max()}, at most {top:.2g})."
    )
    alt = "Log-log lines of attention output error against rank, one per call site."
    return caption, alt


def swap_section(
    audit_file: Mapping[str, Any] | None,
    figs: Any,
    path: str | os.PathLike,
) -> list[Any]:
    """The section's items for ``display``: its words, and with the audit's file the table
    and the figure (through ``figs.show``, :class:`rpka.report.Figures`)."""
    items: list[Any] = [Markdown(swap_text(audit_file, path))]
    if audit_file and audit_file.get("rows"):
        items.append(Markdown(swap_table(audit_file).to_markdown(index=False, floatfmt=".4g")))
        fig = plot_errors(pd.DataFrame(audit_file["rows"]))
        items.append(figs.show(fig, *swap_caption(audit_file), name="report_swap_errors"))
    return items
