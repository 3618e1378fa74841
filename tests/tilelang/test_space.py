"""The search space: it loads, its default fits every workload, and plan_for rejects by its rules."""

from __future__ import annotations

import pytest

from tuner.errors import ConfigError
from tuner.frozen import Config
from tuner.kernels.mamba2_chunk_cumsum.tilelang_program import plan_for
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
        assert plan.segments == 32 and plan.smem_bytes <= 232448  # 227 KB, the sm_90 per-block limit


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"block_h": 32, "rows": 4, "pad": 8, "threads": 1024}, "shared memory"),
        ({"threads": 64, "block_h": 32, "rows": 4}, "threads % (rows * block_h) == 0"),
        ({"threads": 128, "block_h": 32, "rows": 4}, "two-level"),
        ({"vec": 4, "pad": 1}, "must be aligned"),
        ({"vec": 4, "layout": "hq", "pad": 2}, "must be aligned"),
        ({"threads": 1024, "block_h": 1}, "segments"),
        ({"rows": 4}, "(S // Q) % rows == 0"),
        ({"threads": 1024, "block_h": 2, "scan": "serial", "prefix": "serial"}, "threads * vec"),
        ({"scan": "serial", "prefix": "tree"}, "prefix == 'serial'"),
        ({"store": "direct", "scan": "serial", "prefix": "serial"}, "direct store"),
        ({"store": "direct", "layout": "hq", "vec": 4, "pad": 4}, "no access uses vec"),
        ({"scan": "warp"}, "each thread stores its own segment"),
        ({"scan": "warp", "store": "direct", "prefix": "serial"}, "tree's rounds"),
        ({"scan": "warp", "store": "direct", "block_h": 2}, "in one warp"),
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
