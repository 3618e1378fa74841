"""Fingerprint binding, online (a real server) and offline (an export file), on SQLite and PostgreSQL: entries
of the requester's device name and software are preferred; another's are answered ``nearest`` with what
differs; a shape the server rejects is rejected offline alike."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fixtures.servers import TOKENS, export, publish, thread_server
from tuner import db
from tuner.api.settings import ApiSettings
from tuner.measure.devices.common import library_versions
from tuner.service.client import Client, ClientError

NAME = "fault_vector_scale_tunable"
HERE = {k: v for k, v in library_versions().items() if k != "python"}
OLD = {**HERE, "triton": "0.0.1"}


@pytest.fixture
def store(db_url: str) -> Iterator[db.Store]:
    with db.Store.open(db_url) as store:
        # n=1024 measured under an older Triton; n=2048 under the software installed here.
        publish(store, NAME, {"n": 1024}, {"mode": "ok", "BLOCK": 512}, 10.0, libraries=OLD)
        publish(store, NAME, {"n": 2048}, {"mode": "ok", "BLOCK": 256}, 12.0)
        yield store


def test_the_requesters_software_is_preferred_and_another_is_never_exact(server: str) -> None:
    def best(**params: object) -> dict:  # type: ignore[type-arg]
        response = httpx.get(f"{server}/v1/best", params={"template": NAME, "device": "cpu", "n": 1024, **params})
        assert response.status_code == 200, response.text
        return response.json()  # type: ignore[no-any-return]

    ours = ",".join(f"{k}={v}" for k, v in HERE.items())
    # Our software: the n=2048 entry (ours) beats the exact shape measured under another Triton.
    a = best(software=ours)
    assert a["match"] == "nearest" and a["source_shape"] == {"n": 2048} and a["config"]["BLOCK"] == 256
    assert a["differences"] == [{"what": "shape.n", "requested": 1024, "entry": 2048}] and a["unchecked"] == [
        "device_name"]
    assert a["software"]["triton"] == HERE["triton"]
    # The old Triton asked for: its own entry, exact.
    old = best(software=",".join(f"{k}={v}" for k, v in OLD.items()), device_name="test-cpu")
    assert old["match"] == "exact" and old["config"]["BLOCK"] == 512 and old["differences"] == []
    assert old["unchecked"] == []
    # A Triton nobody measured under: the nearest shape, with the difference listed.
    unknown = best(n=512, software="triton=9.9")
    assert unknown["match"] == "nearest" and unknown["source_shape"] == {"n": 1024}
    assert unknown["differences"] == [{"what": "shape.n", "requested": 512, "entry": 1024},
                                      {"what": "triton", "requested": "9.9", "entry": "0.0.1"}]
    assert any("verified under another triton" in note for note in unknown["notes"])
    # No software given: not compared (as before), and said so.
    plain = best()
    assert plain["match"] == "exact" and plain["unchecked"] == ["device_name", "software"]
    # Another device name, or another template version: nearest, never exact, with what differs.
    other = best(device_name="NVIDIA H200")
    assert other["match"] == "nearest" and other["source_shape"] == {"n": 1024}
    assert other["differences"] == [{"what": "device_name", "requested": "NVIDIA H200", "entry": "test-cpu"}]
    bumped = best(template_version="2")
    assert bumped["match"] == "nearest" and {"what": "template_version", "requested": "2", "entry": "1"} in bumped[
        "differences"]
    bad = httpx.get(f"{server}/v1/best", params={"template": NAME, "device": "cpu", "software": "triton"})
    assert bad.status_code == 422 and "NAME=VERSION" in bad.text


def test_the_client_sends_its_software_and_answers_offline_alike(store: db.Store, server: str,
                                                                 tmp_path: Path) -> None:
    path = tmp_path / "best.json"
    export(store, path, NAME)
    for software in ("auto", OLD, None):
        online = Client(server, software=software)  # type: ignore[arg-type]
        offline = Client.from_file(path, software=software)  # type: ignore[arg-type]
        for n in (1024, 2048, 512):
            for name in (None, "test-cpu", "other"):
                a = online.best(NAME, {"n": n}, device="cpu", device_name=name)
                b = offline.best(NAME, {"n": n}, device="cpu", device_name=name)
                assert (a.match, dict(a.config), a.differences, a.unchecked) == (
                    b.match, dict(b.config), b.differences, b.unchecked), (software, n, name)
    # "auto" detects the software installed here: the n=1024 entry (old Triton) is not exact for it.
    auto = Client.from_file(path).best(NAME, {"n": 1024}, device="cpu")
    assert auto.match == "nearest" and auto.source_shape == {"n": 2048}
    assert Client.from_file(path, software=OLD).best(NAME, {"n": 1024}, device="cpu").match == "exact"


def test_offline_shapes_are_validated_as_the_server_does(tmp_path: Path) -> None:
    """The chunk-cumsum template's shape rules (S a multiple of Q…) travel in the export file."""
    store = db.Store.open(db.sqlite_url(tmp_path / "t.db"))
    path = tmp_path / "best.json"
    export(store, path, "mamba2_chunk_cumsum")
    settings = ApiSettings(db_url=store.unmasked_url(), tokens=TOKENS, warm_templates=False)  # type: ignore[arg-type]
    with thread_server(settings, store) as base:
        online, offline = Client(base, software=None), Client.from_file(path, software=None)
        rejected = ({"B": 1, "S": 500, "H": 8}, {"B": 1, "S": 4096, "H": 8, "Q": 48}, {"B": 0, "S": 256, "H": 8},
                    {"B": 1, "S": 256, "H": 8, "dtype": "int8"}, {"B": 1, "S": 256}, {"B": 1, "S": 256, "H": 8, "X": 1})
        for shape in rejected:
            with pytest.raises(ClientError) as on:
                online.best("mamba2_chunk_cumsum", shape, device="cuda")
            with pytest.raises(ClientError) as off:
                offline.best("mamba2_chunk_cumsum", shape, device="cuda")
            assert on.value.status == off.value.status == 422, shape
            assert str(on.value).split(": ", 1)[1].endswith(str(off.value).split(": ", 1)[1]), (on.value, off.value)
        good = {"B": 1, "S": 512, "H": 8}
        assert online.best("mamba2_chunk_cumsum", good, device="cuda").shape == offline.best(
            "mamba2_chunk_cumsum", good, device="cuda").shape
    store.close()
