from __future__ import annotations

import pytest

from tuner.frozen import Config, Shape


def test_order_independent_equality_hash_and_key() -> None:
    a = Shape({"S": 4096, "B": 1, "dtype": "float16", "has_bias": False})
    b = Shape(dtype="float16", B=1, has_bias=False, S=4096)
    assert a == b and hash(a) == hash(b)
    assert a.key() == "B=1,S=4096,dtype=float16,has_bias=false"
    assert Shape.from_json(a.to_json()) == a
    assert {a: 1}[b] == 1


def test_config_and_shape_are_distinct_types_but_compare_by_items() -> None:
    assert Config(x=1) == {"x": 1}
    assert Config(x=1) != Config(x=2)
    assert Config(x=1).replace(x=2) == Config(x=2)


def test_rejects_non_scalar_values() -> None:
    with pytest.raises(TypeError, match="values must be"):
        Config(x=[1, 2])  # type: ignore[arg-type]


def test_immutable() -> None:
    c = Config(x=1)
    with pytest.raises(TypeError):
        c["x"] = 2  # type: ignore[index]


def test_pickled_maps_hash_like_fresh_ones_in_another_process() -> None:
    import pickle
    import subprocess
    import sys

    blob = pickle.dumps(Config(layout="rows", BLOCK_H=4))
    code = (
        "import pickle, sys; from tuner.frozen import Config; "
        "c = pickle.loads(sys.stdin.buffer.read()); "
        "print({Config(layout='rows', BLOCK_H=4): 'hit'}.get(c, 'miss'))"
    )
    out = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, check=True)
    assert out.stdout.decode().strip() == "hit"
