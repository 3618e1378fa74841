from __future__ import annotations

import random
from pathlib import Path

import optuna
import pytest

from tuner.driver.samplers import exhausted, make_sampler
from tuner.errors import ConfigError, SearchSpaceError
from tuner.frozen import Config, Shape
from tuner.space import load_space, parse_space

SPACE = {
    "template": "t",
    "parameters": {
        "BLOCK_H": {"type": "pow2", "low": 1, "high": 16},
        "ROWS": {"type": "int", "low": 1, "high": 7, "step": 2},
        "layout": {"type": "categorical", "choices": ["heads", "rows"]},
        "persistent": {"type": "bool"},
    },
    "constraints": [
        {"expr": "BLOCK_H <= H", "reason": "more heads per program than heads"},
        "S % (ROWS * Q) == 0 or layout == 'heads'",
    ],
    "default": {"BLOCK_H": 4, "ROWS": 1, "layout": "heads", "persistent": False},
}
DIMS = ("H", "S", "Q")


def test_domains_and_size() -> None:
    space = parse_space(SPACE, source="t.yaml", shape_dims=DIMS)
    assert space.param("BLOCK_H").choices == (1, 2, 4, 8, 16)
    assert space.param("ROWS").choices == (1, 3, 5, 7)
    assert space.param("persistent").choices == (False, True)
    assert space.size() == 5 * 4 * 2 * 2 == len(list(space.iter_configs()))
    assert space.default == Config(BLOCK_H=4, ROWS=1, layout="heads", persistent=False)


def test_constraints_see_shape_and_name_the_violation() -> None:
    space = parse_space(SPACE, source="t.yaml", shape_dims=DIMS)
    shape = Shape(H=8, S=768, Q=256)
    assert space.check(Config(BLOCK_H=8, ROWS=3, layout="rows", persistent=True), shape) is None
    reason = space.check(Config(BLOCK_H=16, ROWS=1, layout="rows", persistent=True), shape)
    assert reason is not None and "more heads per program" in reason
    assert not space.is_valid(Config(BLOCK_H=1, ROWS=5, layout="rows", persistent=False), shape)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["parameters"]["BLOCK_H"].update(low=3), "parameters.BLOCK_H.pow2: Value error, low (3)"),
        (lambda d: d["parameters"]["ROWS"].update(high=0), "parameters.ROWS.int: Value error, high (0) < low"),
        (lambda d: d["parameters"]["layout"].update(type="enum"), "parameters.layout"),
        (lambda d: d.update(extra=1), "extra: Extra inputs are not permitted"),
        (lambda d: d["default"].update(BLOCK_H=3), "default: parameter BLOCK_H: 3 is not one of"),
        (lambda d: d["default"].pop("ROWS"), "default: missing parameter(s) ROWS"),
        (lambda d: d["constraints"].append("BLOKC_H < 2"), "constraints.2: unknown name(s) BLOKC_H"),
        (lambda d: d["constraints"].append("open('x')"), "constraints.2: only calls to"),
        (lambda d: d["parameters"].update(H={"type": "bool"}), "H is also a shape dim"),
        (lambda d: d["parameters"].update(comparator={"type": "bool"}), "'comparator' is reserved for comparators"),
    ],
)
def test_invalid_files_name_the_offending_key(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    import copy

    data = copy.deepcopy(SPACE)
    mutate(data)
    with pytest.raises(SearchSpaceError) as info:
        parse_space(data, source="bad.yaml", shape_dims=DIMS)
    assert str(info.value).startswith("bad.yaml: ")
    assert message in str(info.value)


def test_load_space_reports_yaml_and_io_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("parameters: [unclosed")
    with pytest.raises(SearchSpaceError, match="invalid YAML"):
        load_space(bad)
    with pytest.raises(SearchSpaceError, match="cannot read"):
        load_space(tmp_path / "missing.yaml")


def test_validate_config() -> None:
    space = parse_space(SPACE, source="t.yaml", shape_dims=DIMS)
    with pytest.raises(ConfigError, match="unknown parameter"):
        space.validate_config({**space.default, "BOGUS": 1})
    with pytest.raises(ConfigError, match="ROWS: 2 is not one of"):
        space.validate_config({**space.default, "ROWS": 2})
    with pytest.raises(ConfigError, match="BLOCK_H: True"):
        space.validate_config({**space.default, "BLOCK_H": True})


def test_suggest_covers_the_domain_with_optuna() -> None:
    space = parse_space(SPACE, source="t.yaml", shape_dims=DIMS)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(200):
        trial = study.ask()
        config = space.suggest(trial)
        assert space.validate_config(config) == config
        seen.add(config)
        study.tell(trial, 1.0)
    assert len(seen) > 40


def test_grid_sampler_enumerates_every_point() -> None:
    space = parse_space(SPACE, source="t.yaml", shape_dims=DIMS)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = make_sampler("grid", space, seed=0)
    study = optuna.create_study(sampler=sampler)
    seen = set()
    while not exhausted(sampler, study):
        trial = study.ask()
        seen.add(space.suggest(trial))
        study.tell(trial, 1.0)
    assert seen == set(space.iter_configs())
    assert len(study.trials) == space.size()


def test_sample_draws_only_valid_configs() -> None:
    space = parse_space(SPACE, source="t.yaml", shape_dims=DIMS)
    shape = Shape(H=2, S=512, Q=256)
    rng = random.Random(0)
    for _ in range(50):
        assert space.is_valid(space.sample(rng, shape), shape)
    with pytest.raises(ConfigError, match="no valid config"):
        space.sample(rng, Shape(H=0, S=1, Q=1), attempts=20)


def test_valid_configs_are_the_valid_points_in_order_within_a_subspace() -> None:
    space = parse_space(SPACE, source="t.yaml", shape_dims=DIMS)
    shape = Shape(H=4, S=12, Q=2)
    assert list(space.valid_configs(shape)) == [c for c in space.iter_configs() if space.is_valid(c, shape)]
    only = {"layout": ["rows"], "ROWS": [3, 1]}
    within = list(space.valid_configs(shape, only))
    assert within == [c for c in space.iter_configs() if space.is_valid(c, shape)
                      and c["layout"] == "rows" and c["ROWS"] in (1, 3)]
    assert {c["ROWS"] for c in within} == {1, 3} and all(c["BLOCK_H"] <= 4 for c in within)
    assert space.restrict(only)["ROWS"] == (1, 3)  # the parameter's own order


@pytest.mark.parametrize(
    ("only", "message"),
    [({"nope": [1]}, "unknown parameter 'nope'"), ({"ROWS": [2]}, "ROWS: 2 is not one of 1, 3, 5, 7"),
     ({"persistent": [1]}, "persistent: 1 is not one of False, True"), ({"layout": []}, "no value given")],
)
def test_a_bad_restriction_names_the_parameter(only: dict[str, list[object]], message: str) -> None:
    space = parse_space(SPACE, source="t.yaml", shape_dims=DIMS)
    with pytest.raises(ConfigError, match=message):
        space.restrict(only)
