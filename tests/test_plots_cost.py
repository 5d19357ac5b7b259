"""The error-against-cost figure (rpka.report.figures_cost) and the arm palette
(rpka.report.palette) on the committed full study's bench reports: one colour per arm in
every figure, the primary arm in the legend, labelled log axes, at most ~6 arms a panel."""


import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
import pytest

from rpka import paths
from rpka.io import read_json
from rpka.report import figures, figures_cost, palette

RESULTS = paths.resolve(paths.results_dir("full"))
BENCHES = sorted(RESULTS.glob("**/bench_report.json"))


def _report(path):
    return read_json(path)  # with its timings, kept beside it


def test_an_arm_has_one_colour_whatever_the_other_arms_and_their_order():
    names = ["exact", "rpka-r16", "rpka-r64", "mean-attention", "nystrom-uniform-r16"]
    once = figures._arm_colors(names)
    again = figures._arm_colors(list(reversed(names)) + ["performer-r16", "rpka-r16-greedy"])
    assert all(once[n] == again[n] for n in names)
    assert palette.arm_colour("exact") == palette.EXACT
    assert palette.arm_colour("mean-attention") == palette.CONTROL
    # a peer has its method's colour at the base rank, a lighter or darker shade elsewhere
    at_base = palette.arm_colour(f"nystrom-uniform-r{palette.PEER_BASE_RANK}")
    assert at_base == palette.method_colour("nystrom-uniform")
    peers = [palette.arm_colour(f"nystrom-uniform-r{k}") for k in (8, 16, 32, 64, 128)]
    assert len(set(peers)) == len(peers)
    ranks = [palette.arm_colour(f"rpka-r{k}") for k in (4, 8, 16, 32, 64, 96, 48)]
    assert len(set(ranks)) == len(ranks) and all(mcolors.is_color_like(c) for c in ranks)


@pytest.mark.parametrize("path", BENCHES, ids=lambda p: p.parent.name)
def test_every_arm_is_in_the_legend_the_primary_marked_and_the_axes_say_log(path):
    report = _report(path)
    fig = figures_cost.plot_error_vs_time(report)
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    # a wiring check (positive control) is labelled so beside its name
    labels = {
        t.get_text().removesuffix(" (wiring check)") for lg in legends for t in lg.get_texts()
    }
    timed = [a for a in report["arms"] if a in report["timings"]["step_ms_median"]]
    primary = f"{report['primary_arm']} (primary)"
    assert primary in labels
    assert {a for a in timed if a != report["primary_arm"]} <= labels
    bold = [t for lg in legends for t in lg.get_texts() if t.get_text() == primary]
    assert bold and all(t.get_fontweight() == "bold" for t in bold)
    for ax in fig.axes:
        assert ax.get_xscale() == "log" and "(log scale)" in ax.get_xlabel()
        drawn = {line.get_label() for line in ax.containers}  # one errorbar per arm
        assert len(drawn) <= figures_cost.MAX_SERIES + 1  # the group's arms and exact
        colours = [c.lines[0].get_color() for c in ax.containers]
        assert len(set(colours)) == len(colours)  # no two arms of a panel share a colour
        for container in ax.containers:
            name = container.get_label().removesuffix(" (primary)").removesuffix(" (wiring check)")
            assert container.lines[0].get_color() == palette.arm_colour(name)
    plt.close(fig)


def test_a_latency_panel_says_it_is_another_length():
    report = _report(RESULTS / "bench_report.json")
    latency = {a: 1.0 + i for i, a in enumerate(report["arms"])}
    fig = figures_cost.plot_error_vs_time(report, latency, 4096)
    titles = [ax.get_title() for ax in fig.axes]
    assert any("not this track's" in t and "4096" in t for t in titles)
    plt.close(fig)
