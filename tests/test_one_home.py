"""One home per concept (issue 44, item 2): one gate function, alpha typed once (report
prose formats it from ``rpka.verdict.stats.ALPHA``), presets as plain values that no
module changes after another built them."""

import re
from pathlib import Path

from rpka.config import presets, presets_tracks
from rpka.verdict import decision, stats

PACKAGE = Path(__file__).resolve().parent.parent / "rpka"


def test_one_gate_function():
    """``rpka.verdict.stats.attention_gate`` is the one gate; ``rpka.verdict.decision``
    applies it to a control arm (``control_gate``) and has no second ``attention_gate``."""
    defined = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if re.search(r"^def attention_gate\(", path.read_text(), flags=re.M)
    ]
    assert defined == ["verdict/stats.py"]
    assert not hasattr(decision, "attention_gate")


def test_alpha_is_typed_once():
    assert stats.ALPHA == 0.05
    typed = re.compile(
        r"(α = |alpha = |at |p < |p >= |, )0\.05\b|>= 0\.05\b|\.get\('alpha', 0\.05\)"
    )
    found = [
        f"{path.relative_to(PACKAGE)}:{i}"
        for path in [*(PACKAGE / "report").glob("*.py"), PACKAGE / "study" / "longctx.py"]
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if typed.search(line) and not line.lstrip().startswith("#")
    ]
    assert not found, found


def test_presets_are_plain_values_nothing_changes():
    """``rpka.config.presets`` builds its own dicts: each track's presets module keeps its
    own (no "standard", "frontier" or "pairs-*" added there at import)."""
    assert "standard" not in presets_tracks.FORECAST_PRESETS
    assert "frontier" not in presets_tracks.MOTIF_PRESETS
    assert not [n for n in presets_tracks.RECALL_PRESETS if n.startswith("pairs-")]
    by_track = presets.PRESETS_BY_TRACK
    assert "standard" in by_track["forecast"] and "frontier" in by_track["forecast-motif"]
    assert list(by_track["recall"])[-3:] == ["pairs-4", "pairs-16", "pairs-24"]
    for track, own in (
        ("forecast", presets_tracks.FORECAST_PRESETS),
        ("lm", presets_tracks.LM_PRESETS),
    ):
        assert {n: by_track[track][n] for n in own} == own


def test_the_rule_is_named_once():
    """The frontier's margin and words, the two "cheaper" readings and the gate's level have
    one definition each (``rpka.verdict.decision``; the gate's level in
    ``rpka.config.concerns``, below the verdict); the report formats them, never retypes
    the margin, and no module spells the frontier's verdict words itself."""
    homes = {
        "MARGIN_GAP": ["verdict/decision.py"],
        "NON_INFERIOR": ["verdict/decision.py"],
        "CHEAPER_RATIO_MAX": ["verdict/decision.py"],
        "CHEAPER_UPPER_MAX": ["verdict/decision.py"],
        "STEP_TIE": ["verdict/decision.py"],
        "GATE_MIN_REL": ["config/concerns.py"],
        "NON_INFERIOR_GAP": [],
    }
    for name, home in homes.items():
        assignment = re.compile(rf"^(?:[A-Z_]+, )*{name}(?:, [A-Z_]+)* = ", flags=re.M)
        defined = sorted(
            str(path.relative_to(PACKAGE))
            for path in PACKAGE.rglob("*.py")
            if assignment.search(path.read_text())
        )
        assert defined == home, (name, defined)
    margin = re.compile(r"\b0\.95\b")
    retyped = [
        f"{path.relative_to(PACKAGE)}:{i}"
        for path in (PACKAGE / "report").glob("*.py")
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if margin.search(line) and "confidence" not in line
    ]
    assert not retyped, retyped
    words = re.compile(r"""["'](non-inferior|not shown)["']""")
    spelled = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if words.search(path.read_text())
    ]
    assert spelled == ["verdict/decision.py"], spelled
