"""The configuration by concern: each concern validates itself, one flat form on disk."""

import dataclasses
import json

import pytest

from rpka.config.bench import (
    CONCERNS,
    FLAT_FIELDS,
    BenchConfig,
    DecisionRule,
    Design,
    Execution,
    Studies,
)
from rpka.config.presets import PRESETS_BY_TRACK, get_preset
from rpka.config.presets_longctx import LONGCTX_PRESETS

SMOKE = get_preset("smoke")


def test_the_flat_form_names_every_concern_field_once():
    concern_fields = [f.name for cls in CONCERNS.values() for f in dataclasses.fields(cls)]
    assert sorted(FLAT_FIELDS) == sorted(["preset", *concern_fields])
    assert len(set(FLAT_FIELDS)) == len(FLAT_FIELDS)


def test_to_dict_is_flat_in_order_and_round_trips_for_every_preset():
    for track, presets in PRESETS_BY_TRACK.items():
        for name, config in presets.items():
            data = config.to_dict()
            assert tuple(data) == FLAT_FIELDS, (track, name)
            assert BenchConfig.from_dict(json.loads(json.dumps(data))) == config
    for config in LONGCTX_PRESETS.values():
        data = config.to_dict()
        assert tuple(data["bench"]) == FLAT_FIELDS
        assert type(config).from_dict(json.loads(json.dumps(data))) == config


def test_every_field_reads_on_its_concern_alone():
    # one name per field (issue 44): config.design.eval_seeds, no config.eval_seeds alias
    for name in FLAT_FIELDS[1:]:
        concern = next(c for c, cls in CONCERNS.items() if name in cls.__dataclass_fields__)
        assert hasattr(getattr(SMOKE, concern), name)
        assert not hasattr(SMOKE, name), name


def test_of_and_replace_take_the_flat_names():
    parts = [getattr(SMOKE, concern) for concern in CONCERNS]
    flat = {"preset": SMOKE.preset} | {
        f.name: getattr(part, f.name) for part in parts for f in dataclasses.fields(part)
    }
    assert BenchConfig.of(**flat) == SMOKE
    changed = SMOKE.replace(margin=0.05, n_workers=3, eval_seeds=(100, 101, 102))
    assert changed.decision.margin == 0.05 and changed.execution.n_workers == 3
    assert changed.design.eval_seeds == (100, 101, 102)
    assert changed.design.arms == SMOKE.design.arms and SMOKE.decision.margin != 0.05
    with pytest.raises(ValueError, match="BenchConfig keys"):
        SMOKE.replace(no_such_field=1)


def test_each_concern_validates_itself_naming_the_parameter():
    design = SMOKE.design
    with pytest.raises(ValueError, match="eval_seeds"):
        dataclasses.replace(design, eval_seeds=(0,)).validate()  # shares the sweep seed
    with pytest.raises(ValueError, match="learning_rates"):
        dataclasses.replace(design, learning_rates=(-1.0,)).validate()
    with pytest.raises(ValueError, match="primary_arm"):
        DecisionRule(primary_arm="exact").validate(design)  # the baseline itself
    with pytest.raises(ValueError, match="margin"):
        DecisionRule(primary_arm="rpka-r4", margin=-1.0).validate(design)
    with pytest.raises(ValueError, match="ablation_reference"):
        Studies(ablation_reference="no-such-arm").validate(design)
    with pytest.raises(ValueError, match="mechanism"):
        Studies(mechanism={"no_such_option": 1}).validate(design)
    with pytest.raises(ValueError, match="n_workers"):
        Execution(n_workers=0).validate()
    with pytest.raises(ValueError, match="device"):
        Execution(device="tpu").validate()


def test_a_bench_validates_through_its_concerns():
    with pytest.raises(ValueError, match="seeds_per_job"):
        SMOKE.replace(seeds_per_job=0).validate()
    with pytest.raises(ValueError, match="control_arm"):
        SMOKE.replace(control_arm="exact").validate()
    assert isinstance(SMOKE.design, Design)
