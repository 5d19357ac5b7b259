"""The report package: one module per section of the report page
(``notebooks/06_report``), each turning result files into figures, tables and prose
(docs/design.md section 8 says where a section lives and how to add one).

- ``page``: the header, the study index (``load_study``), numbered figures
  (``Figures``), the targets table;
- ``summary``: the answer sentence, the all-tracks table, the headline figure;
- ``frontier``: the rank frontier and the aggregate view;
- ``track``: each track's section; ``longrange``: the long-range study;
- ``sections``: the long-context section, memory beside speed;
- ``appendix``: the verdicts table and each track's appendix;
- below them the words (``text_track``, ``text``, ``narrative``), the tables
  (``tables``), the figures (``figures`` and ``figures_*``, colours from ``palette``) and
  the README's results block (``readme``).

``from rpka import report`` gives the page's functions (``report.load_study``,
``report.Figures``, ...) and each section as ``report.<section>``.

May import: every stage but the command line (the study's result files and their
readers: ``rpka.study``, ``rpka.verdict``, ``rpka.speed``, ``rpka.config``, ``rpka.tracks``,
...); nothing below it imports it (a forbidden contract).
"""

from rpka import numerics

numerics.pin()  # a study stage: pinned CPU numerics before torch runs (rpka.numerics)

from rpka.report import (
    appendix,
    frontier,
    longrange,
    page,
    sections,
    summary,
    track,
)
from rpka.report.appendix import appendix_section, verdicts_table
from rpka.report.page import (
    BENCH_REPORT_KEYS,
    Figures,
    header,
    inline_html,
    load_study,
    optional_json,
    page_title,
    preview_banner,
    provenance,
    targets,
)
from rpka.report.track import track_headline, track_section

__all__ = [
    "BENCH_REPORT_KEYS",
    "Figures",
    "appendix",
    "appendix_section",
    "frontier",
    "header",
    "inline_html",
    "load_study",
    "longrange",
    "optional_json",
    "page",
    "page_title",
    "preview_banner",
    "provenance",
    "sections",
    "summary",
    "targets",
    "track",
    "track_headline",
    "track_section",
    "verdicts_table",
]
