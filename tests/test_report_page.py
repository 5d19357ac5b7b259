"""Issue 29's defects, one test each where a test can see them: on the committed full and
standard report pages (docs/rpka_report_<preset>.html, as a reader gets them) for the words,
and on the figures the report's sections draw from the committed full study for the
figures (log axes labelled, at most six series a panel, the primary arm in the legend)."""

import html
import re

import matplotlib
import pytest

from rpka import paths, report
from rpka.io import read_json
from rpka.report import figures, figures_headline, longrange, sections, summary
from rpka.report.summary import SUPERSEDED_TRACK
from rpka.study.notebook_params import check

matplotlib.use("Agg")

ROOT = paths.REPO_ROOT
PAGES = {p: ROOT / "docs" / f"rpka_report_{p}.html" for p in ("full", "standard")}
MAX_SERIES = 6
# legend entries that are guides, not series: exact and the controls as references, zones,
# fronts, margins and lines
GUIDES = re.compile(r"^(exact|mean-attention)$|exact attention|no attention|control|zone|"
                    r"front|margin|line|x = 1|a value of the sequence")  # fmt: skip


def _text(preset: str) -> str:
    """The page's words: tags and styles dropped, entities decoded, spaces collapsed."""
    path = PAGES[preset]
    if not path.exists():
        pytest.skip(f"no committed {path.name}")
    page = re.sub(r"<style.*?</style>", "", path.read_text(), flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page)))


@pytest.mark.parametrize("preset", list(PAGES))
def test_the_summary_opens_with_the_answer_sentence(preset):
    summary_text = _text(preset).split("Summary ¶", 1)[1]
    assert summary_text.lstrip().startswith("When does RPKA stop losing, at what cost?")


@pytest.mark.parametrize("preset", list(PAGES))
def test_the_all_tracks_table_has_the_long_context_and_long_range_rows(preset):
    """A row per long-context and long-range length the study ran (its index says which)."""
    text = _text(preset)
    table = text[text.index("track length gate primary arm") : text.index("Gate : the track")]
    study = read_json(ROOT / "data" / "results" / preset / "study.json")
    assert ("long context (regimes, local task)" in table) == bool(study.get("longctx"))
    # the full study's 8-seed long-range rows are labelled superseded (issue 53)
    longrange = "long range (two controls)" in table or SUPERSEDED_TRACK in table
    assert longrange == bool(study.get("longrange"))
    assert longrange or preset != "full"


@pytest.mark.parametrize("preset", list(PAGES))
def test_generated_key_paths_keep_their_angle_brackets(preset):
    """``arms.<arm>.sweep`` once rendered as "arms..sweep[]" (an unescaped ``<arm>``)."""
    assert "..sweep[]" not in _text(preset)


@pytest.mark.parametrize("preset", list(PAGES))
def test_the_statistics_name_the_ci_method_and_the_tost_interval(preset):
    text = _text(preset)
    assert "Intervals are 95 % paired-t confidence intervals of the mean difference" in text
    assert "the tests are paired sign-flip permutation tests" in text
    assert "TOST equivalence uses the 90 % interval" in text


@pytest.mark.parametrize("preset", list(PAGES))
def test_leave_one_seed_out_says_how_many_seeds_flip_it(preset):
    text = _text(preset)
    assert not re.search(r"[Oo]ne seed flips this verdict", text)
    flips = re.findall(r"([^.]*) flips this verdict", text)
    assert all(re.search(r"Dropping any one of \d+ of the \d+ seeds$", f) for f in flips), flips


@pytest.mark.parametrize("preset", list(PAGES))
def test_one_learning_rate_is_not_called_swept(preset):
    text = _text(preset)
    assert not re.search(r"Learning rates? \[?[\d.e-]+\]? swept", text)
    for rates in re.findall(r"Learning rates ((?:[\d.e-]+,? )+)swept", text):
        assert "," in rates  # more than one rate


@pytest.mark.parametrize("preset", list(PAGES))
def test_the_two_perplexities_are_labelled_on_the_page(preset):
    text = _text(preset)
    assert "test perplexity as exp(mean NLL over seeds)" in text
    assert "Mean of the seeds' test perplexities" in text


@pytest.mark.parametrize("preset", list(PAGES))
def test_memory_stands_beside_speed(preset):
    text = _text(preset)
    section = text[text.index("Speed and memory ¶") : text.index("Causal use: leakage")]
    assert "Memory. RPKA r=64's forward peak is" in section
    assert "exact forward peak (MiB)" in section


@pytest.mark.parametrize("preset", list(PAGES))
def test_each_step_target_names_the_track_it_is_measured_on(preset):
    """The 96-token step target once quoted the forecast track as if it were the motif
    track's: each step target names its track (each track's own ratio is in the Summary)."""
    text = _text(preset)
    steps = re.findall(r"rpka-r\d+ training step at \d+ tokens ≤", text)
    named = re.findall(r"[\w-]+ track: rpka-r\d+ training step at \d+ tokens ≤", text)
    assert steps and len(named) == len(steps)


# --------------------------------------------------------------------------- figures


class Recording(report.Figures):
    """``report.Figures`` that keeps each figure shown, with the section that showed it."""

    def __init__(self) -> None:
        super().__init__(figures_dir=None)
        self.drawn: list[tuple[str, object]] = []
        self.section = ""

    def show(self, fig, caption, alt, name=None):
        self.drawn.append((self.section, fig))
        return super().show(fig, caption, alt, name)


@pytest.fixture(scope="module")
def drawn():
    """The figures the summary, frontier, track and long-range sections draw from the
    committed full study (the page's calls, notebooks/06_report.ipynb), and the study."""
    p = check("06_report.ipynb", {"preset": "full", "compute_missing": False})
    if not (ROOT / p["study_json"]).exists():
        pytest.skip("no committed full study here")
    figures.set_style()
    figs = Recording()
    runs = report.load_study(p["study_json"], "full", compute=False)
    frontier = report.optional_json(p["frontier_json"])
    figs.section = "summary"
    rows = summary.headline_rows(runs, summary.longctx_reports(runs, p["results_dir"]),
                                 summary.longctx_reports(runs, p["results_dir"], key="longrange"))
    figs.show(figures_headline.plot_headline(rows), *summary.headline_caption(rows))
    figs.section = "frontier"
    report.frontier.frontier_section(
        frontier, figs, None, report.frontier.load_spectra(frontier, p["results_dir"]),
        aggregate=report.frontier.load_aggregate(p["results_dir"]))  # fmt: skip
    for name, track in runs["tracks"].items():
        figs.section = name
        report.track_section(track, figs, None)
    figs.section = "longrange"
    longrange_file, locality = longrange.load_files(p["longrange_dir"])
    longrange.longrange_section(runs, frontier, longrange_file, locality, figs, None)
    figs.section = "longctx"
    sections.longctx_section(runs["longctx"], report.optional_json(paths.longctx_json("full")),
                             figs, None)  # fmt: skip
    return runs, figs.drawn


def _legend_texts(fig) -> list[str]:
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    return [t.get_text() for legend in legends for t in legend.get_texts()]


def test_every_log_axis_says_so(drawn):
    _, shown = drawn
    unlabelled = [
        (section, ax.get_title(), axis)
        for section, fig in shown
        for ax in fig.axes
        for axis, scale, label in (("x", ax.get_xscale(), ax.get_xlabel()),
                                   ("y", ax.get_yscale(), ax.get_ylabel()))
        if scale == "log" and label and "log" not in label
    ]  # fmt: skip
    assert unlabelled == []


def test_at_most_six_series_a_panel(drawn):
    _, shown = drawn
    crowded = []
    for section, fig in shown:
        for ax in fig.axes:
            _, labels = ax.get_legend_handles_labels()
            series = {label for label in labels if not GUIDES.search(label)}
            if len(series) > MAX_SERIES:
                crowded.append((section, ax.get_title(), sorted(series)))
    assert crowded == []


def test_the_primary_arm_is_in_every_legend_that_names_arms(drawn):
    """In a track's figures, a legend that names any arm of the track names its primary
    arm too (the forest plot names arms on its axis: the primary among them)."""
    runs, shown = drawn
    assert len(shown) > 10
    for section, fig in shown:
        if section not in runs["tracks"]:
            continue
        bench = runs["tracks"][section]["report"]
        arms = set(bench["arms"])
        methods = {a["method"] for a in bench["arms"].values() if a.get("rank")}
        primary = runs["tracks"][section]["primary_arm"]
        texts = [t.removesuffix(" (primary)") for t in _legend_texts(fig)]
        if (arms - {"exact", "mean-attention"} | methods) & set(texts):  # it draws arms
            assert primary in texts, (section, texts)
        ticks = [t.get_text() for ax in fig.axes for t in ax.get_yticklabels()]
        if arms & {t.split(" ")[0] for t in ticks}:
            assert any(t.startswith(primary) for t in ticks), (section, ticks)


def test_the_frontier_draws_the_performance_profiles(drawn):
    _, shown = drawn
    titles = [ax.get_title() for section, fig in shown if section == "frontier"
              for ax in fig.axes]  # fmt: skip
    assert any(t.startswith("every gated track (") for t in titles)


def test_the_long_context_section_shows_its_training_figure(drawn):
    """``longctx_training.png`` was written but never embedded: the section shows it, the
    primary arm named in its legend."""
    runs, shown = drawn
    if not runs["longctx"]:
        pytest.skip("no long-context study in the committed full index")
    (fig,) = [fig for section, fig in shown if section == "longctx"]
    assert fig.get_suptitle().startswith("Training at long context")
    primary = read_json(ROOT / paths.longctx_json("full"))["config"]["bench"]["primary_arm"]
    assert f"{primary} (primary)" in _legend_texts(fig)


@pytest.mark.parametrize("preset", list(PAGES))
def test_what_lost_is_science_only_and_the_targets_have_their_own_section(preset):
    """"What failed" once mixed the science with the `make report` budget."""
    text = _text(preset)
    lost = text[text.index("What lost.") : text.index("Main limitation.")]
    assert not re.search(r"budget|make report|target|CPU-s", lost), lost
    targets = text[text.index("Targets ¶") : text.index("Limitations ¶")]
    assert "Science bars." in targets and "Engineering targets." in targets
    assert targets.index("Engineering targets.") < targets.index("study budget")
