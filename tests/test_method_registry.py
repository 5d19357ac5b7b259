"""The method metadata of the registry (issue 44, item 3): every method has its entry,
the entries agree with the classes, and the lists the report and the studies used to type
by name are read from it - with the same values as before, so no figure or result moves."""

from rpka.attention import LANDMARK_METHODS, METHOD_INFO, REGISTRY, options_of
from rpka.report import figures_frontier, palette
from rpka.study import dropin
from rpka.verdict import frontier


def test_every_method_has_its_metadata():
    assert list(METHOD_INFO) == list(REGISTRY)
    for name, info in METHOD_INFO.items():
        assert info.family in ("exact", "rpka", "peer", "control"), name
        assert info.has_rank == ("rank" in options_of(name)), name
        assert info.landmarks in (None, "joint", "keys"), name


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
