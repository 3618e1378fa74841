"""The search space: it loads, its default fits every workload, and its constraints are plan_for's rules."""

from __future__ import annotations

import random

import pytest

from tuner.errors import ConfigError
from tuner.frozen import Config
from tuner.kernels.mamba2_chunk_cumsum.tilelang_program import MAX_SMEM_BYTES, plan_for
from tuner.kernels.mamba2_chunk_cumsum.tilelang_template import Mamba2ChunkCumsumTileLang

TEMPLATE = Mamba2ChunkCumsumTileLang()
SPACE = TEMPLATE.space()
SHAPES = [TEMPLATE.workload(w.name) for w in TEMPLATE.workloads]
SHAPES += [TEMPLATE.reduced(s) for s in SHAPES]


def _plan_reason(config: Config, shape) -> str | None:  # type: ignore[no-untyped-def]
    try:
        plan_for(config, shape)
    except ConfigError as exc:
        return str(exc)
    return None


def test_default_is_valid_everywhere() -> None:
    assert SPACE.template == TEMPLATE.name
    for shape in SHAPES:
        assert SPACE.check(SPACE.default, shape) is None, shape
        plan = plan_for(SPACE.default, shape)
        assert plan.segments == 32 and plan.smem_bytes <= MAX_SMEM_BYTES


def test_constraints_agree_with_plan_for() -> None:
    """On random points (valid or not) of the space, the YAML rules and plan_for accept the same configs."""
    rng = random.Random(0)
    valid = 0
    for i in range(4000):
        shape = SHAPES[i % len(SHAPES)]
        config = Config({p.name: rng.choice(p.choices) for p in SPACE.params})
        yaml_ok = SPACE.is_valid(config, shape)
        plan_ok = _plan_reason(config, shape) is None
        assert yaml_ok == plan_ok, (
            config.key(),
            shape.key(),
            SPACE.check(config, shape),
            _plan_reason(config, shape),
        )
        valid += yaml_ok
    assert 200 < valid < 3800  # the rules prune, but not everything


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"block_h": 32, "rows": 4, "pad": 8, "threads": 1024}, "shared memory"),
        ({"threads": 64, "block_h": 32, "rows": 4}, "multiple of rows*block_h"),
        ({"threads": 128, "block_h": 32, "rows": 4}, "two-level"),
        ({"vec": 4, "pad": 1}, "misaligned"),
        ({"vec": 4, "layout": "hq", "pad": 2}, "misaligned"),
        ({"threads": 1024, "block_h": 1}, "segments"),
        ({"rows": 4}, "rows must divide"),
        ({"threads": 1024, "block_h": 2, "scan": "serial", "prefix": "serial"}, "threads*vec"),
        ({"scan": "serial", "prefix": "tree"}, "prefix=tree"),
        ({"store": "direct", "scan": "serial", "prefix": "serial"}, "direct store"),
        ({"store": "direct", "layout": "hq", "vec": 4, "pad": 4}, "vec unused"),
    ],
)
def test_invalid_combinations_are_rejected_before_compile(changes: dict, fragment: str) -> None:
    shape = TEMPLATE.workload("mamba2-780m-b1-s4k")
    if changes.get("rows") == 4 and "block_h" not in changes:
        shape = shape.replace(S=768)  # 3 chunks
    config = SPACE.default.replace(**changes)
    assert not SPACE.is_valid(config, shape)
    reason = _plan_reason(config, shape)
    assert reason is not None and fragment in reason, reason
    with pytest.raises(ConfigError):
        TEMPLATE.build(config, shape)


def test_missing_parameter_is_a_config_error() -> None:
    partial = Config({k: v for k, v in SPACE.default.items() if k != "vec"})
    with pytest.raises(ConfigError, match="vec"):
        plan_for(partial, SHAPES[0])
