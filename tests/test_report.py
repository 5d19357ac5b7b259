"""The report page (rpka.report, rpka.report.text, rpka.report.figures_headline) on a study index
built from a real smoke bench, decided by rpka.verdict.stats' rule (primary unadjusted, Holm over
the rest, TOST at a margin, the attention gate), as the bench writes it."""

import base64
import copy
import json
import re
from types import SimpleNamespace

import IPython
import matplotlib.pyplot as plt
import numpy as np
import pytest
from IPython.core.formatters import DisplayFormatter
from IPython.display import Markdown

from rpka import paths, report
from rpka.cli.pipeline import offline
from rpka.io import FIGURE_DPI, figure_png, save_figure
from rpka.paths import REPO_ROOT as ROOT
from rpka.report import figures, figures_cost, figures_headline, narrative, text, text_track
from rpka.report.tables import arm_group
from rpka.study import index as study_index
from rpka.study import steps as study
from rpka.verdict import stats


def decided(bench: dict, margin: float, min_rel: float, passed: bool | None = None) -> dict:
    """``bench`` with the keys of the current rule, computed by rpka.verdict.stats from its
    per-seed scores (what rpka.bench writes); ``passed`` overrides the gate (a smoke
    bench has too few seeds to pass it)."""
    bench = copy.deepcopy(bench)
    base = bench["arms"][bench["baseline_arm"]]["full"]["per_seed"]
    direction = bench["metric_direction"]
    comparisons = {
        arm: stats.paired_comparison(base, e["full"]["per_seed"], direction, margin)
        for arm, e in bench["arms"].items()
        if arm != bench["baseline_arm"]
    }
    stats.apply_holm(comparisons, primary=bench["primary_arm"])
    control = next(a for a in bench["arms"] if arm_group(bench, a) == "control")
    gate = stats.attention_gate(
        base, bench["arms"][control]["full"]["per_seed"], direction, min_rel=min_rel
    )
    gate["control_arm"] = control
    gate["passed"] = gate["passed"] if passed is None else passed
    for arm, c in comparisons.items():
        bench["arms"][arm]["comparison"] = stats.apply_gate(c, gate)
    bench["attention_gate"] = gate
    bench["decision"] = {
        "primary_arm": bench["primary_arm"],
        "margin": margin,
        "secondary_family": [a for a in comparisons if a != bench["primary_arm"]],
        "alpha": 0.05,
        "rule": "primary unadjusted; Holm over <secondary>; TOST at the margin",
    }
    return bench


@pytest.fixture(scope="module")
def fake_study(smoke_study_report, tmp_path_factory):
    """study.json with two tracks from the smoke bench: one whose gate passes (forced) and
    one whose gate fails (the control must be 1000 % worse)."""
    bench, _ = smoke_study_report
    root = tmp_path_factory.mktemp("study")
    passing = decided(bench, margin=0.05, min_rel=0.0, passed=True)
    failing = decided(bench, margin=0.05, min_rel=10.0)
    assert not failing["attention_gate"]["passed"]
    primary = passing["primary_arm"]
    passing["config"]["arms"][-1]["lr_from"] = primary  # a borrowed learning rate
    flipped = passing["arms"][primary]["comparison"]
    flipped.update(verdict_flipped_by_one_seed=True, flipping_seeds=[1], n_pairs=8)
    passing["arms"][primary]["guard_counts"] = {
        "denominator": 5,
        "rows": 100,
        "clamped": 0,
        "entries": 1000,
    }
    tracks = {}
    for name, data in (("failing", failing), ("passing", passing)):
        (root / name).mkdir()
        (root / name / "bench_report.json").write_text(json.dumps(data))
        tracks[data["track"] if name == "passing" else f"{data['track']}-x"] = {
            "bench_report": f"{name}/bench_report.json",
            "attention_gate": data["attention_gate"],
            "primary_arm": data["primary_arm"],
            "verdicts": {
                a: e["comparison"]["verdict"]
                for a, e in data["arms"].items()
                if e.get("comparison")
            },
            "run_time_s": 1.0,
        }
    path = root / "study.json"
    path.write_text(json.dumps({"preset": "smoke", "tracks": tracks, "longctx": None}))
    return report.load_study(path, "smoke")


def test_the_index_lists_tracks_that_pass_the_gate_first(fake_study):
    gates = [t["gate"] for t in fake_study["tracks"].values()]
    assert gates == ["passed", "failed"]
    first = next(iter(fake_study["tracks"].values()))
    assert first["comparison"] is first["report"]["arms"][first["primary_arm"]]["comparison"]


def test_without_an_index_or_bench_reports_the_error_names_the_command(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m rpka report --preset no-such"):
        report.load_study(tmp_path / "study.json", "no-such")


def test_summary_has_five_bullets_answers_with_ci_and_a_failed_gate_reads_uninformative(
    fake_study,
):
    words = text.summary_bullets(fake_study)
    top = re.split(r"^(?=- )", words, flags=re.M)[1:]  # each top bullet with its sub-bullets
    assert len(top) == 5
    passing, failing = fake_study["tracks"].values()
    c = passing["comparison"]
    assert text.ci_text(c) in top[0] and c["verdict"] in top[0]
    assert c["verdict"] != "uninformative" and "uninformative" not in top[0]
    assert "uninformative: this track does not need attention" in top[1]
    flipping = len(c["flipping_seeds"])  # how many, not "one": 5 of 8 seeds flipped lm's
    assert f"Dropping any one of {flipping} of the {c['n_pairs']} seeds flips" in top[0]
    assert top[2].startswith("- **Speed.**") and top[4].startswith("- **Main limitation.**")


def test_disclosures_name_borrowed_rates_single_seed_verdicts_and_guards(fake_study):
    passing = next(iter(fake_study["tracks"].values()))
    words = text_track.disclosures(passing["report"])
    primary = passing["primary_arm"]
    assert "Borrowed learning rates" in words and f"from `{primary}`" in words
    seed = passing["report"]["arms"][primary]["seeds"][1]
    assert "Single-seed-driven" in words and f"dropping seed {seed}" in words
    assert f"`{primary}` 5.0 %" in words  # 5 of 100 rows floored
    assert "predates" not in words  # the report has the rule's keys


def test_figures_are_numbered_with_alt_text_and_escaped_captions():
    figs = report.Figures()
    for i in (1, 2):
        fig, ax = plt.subplots()
        out = figs.show(fig, f"**Message {i}** about `<arm>`", f'alt "{i}" <x>').data
        assert f"<b>Figure {i}.</b> <b>Message {i}</b> about <code>&lt;arm&gt;</code>" in out
        assert f'alt="alt &quot;{i}&quot; &lt;x&gt;"' in out
        assert re.search(r'src="data:image/png;base64,[A-Za-z0-9+/=]+"', out)
        assert not plt.fignum_exists(fig.number)  # not shown a second time without alt


def test_a_saved_figure_is_embedded_from_the_bytes_written_without_drawing_it_again(
    tmp_path, monkeypatch
):
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3])
    path = save_figure(fig, tmp_path / "figs", "line")
    written = path.read_bytes()
    assert written.startswith(b"\x89PNG") and figure_png(fig) == written
    width = int.from_bytes(written[16:20], "big")  # the PNG header: drawn at FIGURE_DPI
    assert width == pytest.approx(fig.get_figwidth() * FIGURE_DPI, rel=0.2)
    drawn = []
    monkeypatch.setattr(fig, "savefig", lambda *a, **k: drawn.append(1))
    html = report.Figures().show(fig, "caption", "alt").data
    assert not drawn and base64.b64encode(written).decode("ascii") in html
    monkeypatch.undo()
    ax.set_title("changed after it was saved")  # drawn anew, not the stale bytes
    assert figure_png(fig) != written and figure_png(fig).startswith(b"\x89PNG")
    unsaved, _ = plt.subplots()  # a figure never saved is drawn for the page
    assert figure_png(unsaved).startswith(b"\x89PNG")
    plt.close(unsaved)


def test_in_a_notebook_a_saved_figure_shows_its_saved_png_at_screen_size(tmp_path, monkeypatch):
    shell = SimpleNamespace(display_formatter=DisplayFormatter())  # a kernel's formatters
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    figures.set_style()
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([1, 2, 3])
    written = save_figure(fig, tmp_path, "line").read_bytes()
    data, metadata = shell.display_formatter.format(fig)
    assert base64.b64decode(data["image/png"]) == written
    width = int.from_bytes(written[16:20], "big")
    assert metadata["image/png"]["width"] == round(width * fig.dpi / FIGURE_DPI)
    plt.close(fig)


def test_forest_plot_puts_controls_in_their_own_panel_and_the_primary_first(fake_study):
    bench = next(iter(fake_study["tracks"].values()))["report"]
    fig = figures_headline.plot_forest(bench)
    main, controls = fig.axes
    ticks = {t.get_text().split("\n")[0]: t for t in main.get_yticklabels()}
    primary = ticks.pop(f"{bench['primary_arm']} (primary)")
    assert primary.get_fontweight() == "bold"
    assert all(t.get_fontweight() != "bold" for t in ticks.values())
    assert all(primary.get_position()[1] > t.get_position()[1] for t in ticks.values())
    assert all("mean-attention" in t.get_text() for t in controls.get_yticklabels())
    plt.close(fig)


def test_no_pareto_front_through_cis_that_cross_zero(fake_study):
    bench = copy.deepcopy(next(iter(fake_study["tracks"].values()))["report"])
    for entry in bench["arms"].values():
        if entry.get("comparison"):
            entry["comparison"].update(ci_low=-1.0, ci_high=1.0)
    fig = figures_cost.plot_error_vs_time(bench)
    assert not [line for ax in fig.axes for line in ax.lines if line.get_linestyle() == "--"]
    plt.close(fig)
    arm = next(a for a, e in bench["arms"].items() if e.get("comparison"))
    bench["arms"][arm]["comparison"].update(delta_mean=-0.5, ci_low=-0.6, ci_high=-0.4)
    bench["timings"]["step_ms_median"][arm] = 2 * bench["timings"]["step_ms_median"]["exact"]
    fig = figures_cost.plot_error_vs_time(bench)
    (front,) = [line for ax in fig.axes for line in ax.lines if line.get_linestyle() == "--"]
    assert len(front.get_xdata()) == 2  # exact and the one arm told apart from it
    plt.close(fig)


def test_decode_cost_includes_the_redraw_and_the_prefill():
    rows = [
        {"method": m, "context": n, "per_token_ms": t, "prefill_ms": p}
        for m, n, t, p in [("exact", 1, 1.0, 1.0), ("exact", 4, 4.0, 2.0)]
    ] + [
        {
            "method": "rpka",
            "context": n,
            "per_token_ms": 1.0,
            "prefill_ms": 14.0,
            "amortised_redraw_ms_per_token": r,
        }
        for n, r in [(1, 0.0), (4, 0.5)]
    ]
    decode = {"device": "cpu", "config": {"contexts": [1, 4]}, "rows": rows}
    d = text.decode_numbers(decode)
    assert d["growth"] == 1.0 and d["growth_with_redraw"] == pytest.approx(1.5)
    assert d["prefill_ratio"] == pytest.approx(7.0)
    words = text.decode_cost(decode)
    assert d["prefill_worst_ratio"] == pytest.approx(14.0) and d["prefill_worst_context"] == 1
    assert "1.50×" in words and "7.0× exact's" in words and "up to 14.0× (at 1 tokens)" in words


def test_the_mechanism_names_its_model_from_the_description_key():
    sig = {"trained_model": True, "trained_model_description": "rpka-r64, seed 100"}
    assert study.mechanism_model(sig) == "rpka-r64, seed 100"
    assert study.mechanism_model({"trained_model": "old words"}) == "old words"
    assert study.mechanism_model({"trained_model": True}, "fallback") == "fallback"


def test_preview_banner_only_for_previews(fake_study):
    source = {"commit": "abc", "commit_date": "2026-01-01", "dirty": "no", "rendered": "now"}
    assert "Preview, not a result" in report.header("smoke", fake_study, source)
    assert "draw no conclusions" in report.header("quick", fake_study, source)
    # it points to the committed report, not to hours of `make report PRESET=full`
    assert "`docs/rpka_report_full.html`" in report.header("quick", fake_study, source)
    assert (ROOT / "docs/rpka_report_full.html").is_file()
    assert "PRESET=full" not in report.header("quick", fake_study, source)
    assert "Preview" not in report.header("full", fake_study, source)
    assert "commit `abc`" in report.header("full", fake_study, source)
    assert report.page_title("full", "abc") == "RPKA study report (full preset, commit abc)"


def test_offline_html_has_no_script_no_remote_link_and_the_title():
    page = (
        "<html><head><title>Notebook</title>"
        '<script src="https://cdn.example/require.js"></script>'
        '<link rel="stylesheet" href="https://cdn.example/x.css">'
        '<script type="module">await import("https://cdn.example/m.mjs")</script>'
        "</head><body><p>x</p></body></html>"
    )
    out = offline(page, "RPKA <report>")
    assert "<script" not in out and "https:" not in out
    assert "<title>RPKA &lt;report&gt;</title>" in out and "<p>x</p>" in out
    assert "@media print" in out.split("</head>")[0]  # wide tables wrap when printed


def test_appendix_tables_use_words_not_python_reprs(fake_study):
    bench = next(iter(fake_study["tracks"].values()))["report"]
    arms = text_track.arms_table(bench)
    assert not arms["options"].str.contains(r"[{}']", regex=True).any()
    stats_table = text_track.statistics_table(bench)
    assert {"TOST p", "margin", "MDE of the rule", "one seed flips it"} <= set(stats_table)
    assert set(stats_table["verdict"]) <= set(stats.VERDICTS)
    assert np.isfinite(stats_table["delta mean"]).all()


def test_a_flip_that_only_the_seed_count_forces_is_not_called_one_seed(fake_study):
    c = {"n_pairs": 6, "mde_alpha": 0.05, "verdict_flipped_by_one_seed": True}
    assert not text.loso_can_reject(c)  # 5 pairs: the floor 2/32 > 0.05
    assert text.loso_can_reject({**c, "n_pairs": 8})


@pytest.mark.parametrize(("ci_pct", "shown"), [((2000.0, 3000.0), True), ((5e4, 2e5), False)])
def test_the_answer_and_the_relative_text_share_one_near_zero_cut_off(fake_study, ci_pct, shown):
    """Between 1,000 % and the cut-off a relative figure is still written (motif's control:
    +1,300 %); beyond it every text says exact's mean is near 0 instead (recall: 10^5 %)."""
    from rpka.report import narrative

    track = copy.deepcopy(next(t for t in fake_study["tracks"].values() if t["gate"] != "failed"))
    c = track["comparison"]
    c.update(baseline_mean=1.0, delta_mean=sum(ci_pct) / 200, ci_low=ci_pct[0] / 100)
    c["ci_high"] = ci_pct[1] / 100
    answer = text.track_answer(track)
    assert ("near 0" not in answer) is shown
    assert (f"{ci_pct[0]:+.1f}" in answer) is shown
    assert ("near 0" not in narrative.relative_text(ci_pct[1] / 100)) is shown


def test_a_rerun_after_a_fix_shows_each_moved_arm_before_and_now(smoke_study_report, tmp_path):
    """``record_superseded`` keeps the replaced scores; the track section says what moved
    (score, delta, verdict) and which arms reproduced bit for bit."""
    bench, _ = smoke_study_report
    primary = bench["primary_arm"]
    previous = copy.deepcopy(bench)
    previous["arms"][primary]["full"]["per_seed"][0] += 1.0  # the bug's seed
    previous["arms"][primary]["full"]["mean"] += 0.5
    (tmp_path / "old.json").write_text(json.dumps(previous))
    folder = tmp_path / "track"
    folder.mkdir()
    (folder / "bench_report.json").write_text(json.dumps(bench))
    with pytest.raises(ValueError, match="reason and fix"):
        study_index.record_superseded(tmp_path / "old.json", folder, " ", "abc123")
    assert not (folder / paths.SUPERSEDED_FILE).exists()
    study_index.record_superseded(tmp_path / "old.json", folder, "A bug in the solve", "abc123")
    index = {"tracks": {bench["track"]: {"bench_report": "track/bench_report.json"}}}
    (tmp_path / "study.json").write_text(json.dumps(index))
    track = report.load_study(tmp_path / "study.json", "smoke")["tracks"][bench["track"]]
    words = narrative.superseded(track["report"], track["superseded"])
    assert words.startswith("**Rerun after a fix.** A bug in the solve (fixed in abc123).")
    before, now = previous["arms"][primary]["full"]["mean"], bench["arms"][primary]["full"]["mean"]
    assert f"`{primary}` {before:.4g} → {now:.4g} (delta " in words
    others = [f"`{a}`" for a in bench["arms"] if a != primary]
    assert words.endswith(f"Reproduced bit for bit: {', '.join(others)}.")
    shown = report.track_section(track, report.Figures())
    assert any(isinstance(item, Markdown) and item.data == words for item in shown)


def test_the_ablation_rule_keeps_its_key_paths_in_markdown():
    """The rule names ``arms.<arm>.sweep``: unescaped, Markdown's HTML ate ``<arm>`` and the
    report read "arms..sweep[]"."""
    from rpka.verdict.ablations import RULE

    report = {
        "ablation_choice": {
            "reference": "rpka-r16",
            "chosen_arm": "rpka-r16",
            "rule": RULE.format(metric="mse", seeds="0, 1", alpha=0.05, n_others=6),
        }
    }
    words = narrative.ablation_choice(report)
    assert "arms.&lt;arm&gt;.sweep[]" in words and "<arm>" not in words


def test_the_trace_identity_caption_states_the_pooled_decision():
    """The figure shows one Monte Carlo seed; the caption must give the decision the study
    used (pooled over every seed), not that seed's p as the verdict."""
    mechanism = json.loads((ROOT / "data/results/full/forecast-motif/mechanism.json").read_text())
    caption, _ = text.trace_identity_caption(mechanism)
    pooled = mechanism["trained"]["mechanism_signature"]["pooled"]
    assert f"{pooled['n_seeds']} Monte Carlo seeds" in caption
    assert f"χ² p = {pooled['chi2_p']:.3g}" in caption and "fails" not in caption


def test_the_mechanism_section_names_its_track():
    """The mechanism section once did not say which track's model it checks."""
    mechanism = json.loads((ROOT / "data/results/full/forecast-motif/mechanism.json").read_text())
    caption, _ = text.trace_identity_caption(mechanism)
    assert "the Motif forecast track's trained model" in caption
    assert "Motif forecast track's trained model (`forecast-motif`" in text.mechanism_scope(
        mechanism
    )


def test_an_equivalent_verdict_without_power_says_it_is_not_a_finding(fake_study):
    """Two pairs: TOST's interval can fit the margin while the sign-flip rule cannot reject
    at all; the quick preview said "equivalent" beside "zero power" (issue 31 item 6)."""
    track = copy.deepcopy(next(iter(fake_study["tracks"].values())))
    c = track["comparison"]
    c.update(verdict="equivalent", mde=None, n_pairs=2, mde_note="zero power: with 2 pairs")
    words = report.track_headline(track)
    assert "**Verdict: equivalent** by TOST's interval alone" in words
    assert "no power with 2 pairs, so this is not a finding" in words
    c.update(mde=0.01)
    assert report.track_headline(track).endswith("**Verdict: equivalent.**")
