"""The method metadata of the registry (issue 44, item 3): every method has its entry,
the entries agree with the classes, and the lists the report and the studies used to type
by name are read from it - with the same values as before, so no figure or result moves."""

import dataclasses

from rpka.attention import LANDMARK_METHODS, METHOD_INFO, REGISTRY, method_label, options_of
from rpka.config.presets_longctx import ANSWER_METHODS
from rpka.report import figures_frontier, palette, rank_law
from rpka.speed.decoding import DecodeConfig
from rpka.study import dropin
from rpka.verdict import frontier, robustness


def test_every_method_has_its_metadata():
    assert list(METHOD_INFO) == list(REGISTRY)
    for name, info in METHOD_INFO.items():
        assert info.family in ("exact", "rpka", "peer", "control"), name
        assert info.has_rank == ("rank" in options_of(name)), name
        assert info.landmarks in (None, "joint", "keys"), name
        # the figures' marker belongs to the methods that draw landmarks
        assert (info.marker is None) == (not info.landmarks)


def test_the_lists_read_from_the_registry_are_the_ones_typed_before():
    assert LANDMARK_METHODS == ("rpka", "nystrom-uniform", "keys-coreset")
    assert frontier.LOW_RANK_METHODS == LANDMARK_METHODS
    assert frontier.PIVOTING_PEERS == ("nystrom-uniform", "keys-coreset")
    assert dropin.DEFAULT_METHODS == LANDMARK_METHODS
    assert figures_frontier.METHOD_MARKERS == {
        "rpka": "o",
        "nystrom-uniform": "s",
        "keys-coreset": "^",
    }
    assert rank_law.METHODS == {
        "rpka": "RPKA",
        "nystrom-uniform": "uniform",
        "keys-coreset": "key coreset",
    }


def test_the_labels_are_the_ones_typed_before():
    labels = {name: method_label(name) for name in REGISTRY}
    assert labels == {
        "exact": "exact",
        "rpka": "RPKA",
        "nystrom-uniform": "uniform",
        "keys-coreset": "key coreset",
        "nystromformer": "nystromformer",
        "performer": "performer",
        "mean": "mean",
        "local": "local",
    }
    # the long-range answer's prose (rpka.report.longrange)
    assert method_label("rpka", long=True) == "RPKA"
    assert method_label("nystrom-uniform", long=True) == "uniform landmarks"
    assert method_label("no-such-method") == method_label("no-such-method", long=True)
    assert method_label("no-such-method") == "no-such-method"


def test_the_studies_comparisons_live_in_their_configs():
    """Which methods a study compares is its design, not metadata: named in its config."""
    assert ANSWER_METHODS == ("rpka", "nystrom-uniform")
    assert robustness.ANSWER_METHODS is ANSWER_METHODS  # read, not retyped
    assert robustness.longrange_answer({})["n_star"] == dict.fromkeys(ANSWER_METHODS)
    assert DecodeConfig.methods == ("exact", "rpka")
    # a class constant, not a field: the result's "config" (asdict) keeps its keys
    assert "methods" not in {f.name for f in dataclasses.fields(DecodeConfig)}


def test_the_colour_anchors_are_the_palettes_colours():
    assert palette.METHODS == {
        "exact": "#000000",
        "mean": "#949494",
        "rpka": "#de8f05",
        "nystrom-uniform": "#0173b2",
        "keys-coreset": "#6a3d9a",
        "nystromformer": "#e7298a",
        "performer": "#999933",
    }
    assert (palette.EXACT, palette.CONTROL, palette.PRIMARY) == ("#000000", "#949494", "#de8f05")
    assert list(figures_frontier.METHOD_COLOURS) == list(LANDMARK_METHODS)
    assert palette.method_colour("local") == palette.method_colour("local")  # hashed, stable
