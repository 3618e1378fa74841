"""The study / best-config key: everything that changes which config is best.

template name + template version, shape (all dims, dtypes and flags), device kind + device name, and the
software fingerprint digest. Studies, measurements and best configs are stored under it; a best config is
served for a key only if it passed the correctness gate under that same fingerprint.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Literal

from tuner.frozen import Shape

DeviceKind = Literal["cuda", "npu", "cpu"]
KINDS: tuple[DeviceKind, ...] = ("cuda", "npu", "cpu")


# ``Fingerprint.info`` entries each process measures afresh (they vary run to run on one machine).
MEASURED_INFO = frozenset({"copy_bw_bytes_per_s", "sm_clock_mhz_at_start"})


@dataclass(frozen=True)
class Fingerprint:
    """What makes timings on one device comparable with another's.

    ``key_fields`` (kind, device name, driver, runtime, library versions) enter the study key: a change of
    any of them starts a new study. ``info`` holds figures recorded but not keyed (SM clock at start, L2
    size, memory, measured copy bandwidth in bytes/s under ``copy_bw_bytes_per_s``); of those, the ones in
    :data:`MEASURED_INFO` are measured by each process and differ from run to run on the same machine.
    """

    kind: DeviceKind
    device_name: str
    driver: str = ""
    runtime: str = ""  # CUDA / CANN version, or "interpreter" on the CPU backend
    libraries: Mapping[str, str] = field(default_factory=dict)  # torch, triton, tilelang, python…
    info: Mapping[str, float | int | str] = field(default_factory=dict)

    def key_fields(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "device_name": self.device_name,
            "driver": self.driver,
            "runtime": self.runtime,
            "libraries": dict(sorted(self.libraries.items())),
        }

    def hash(self) -> str:
        """Stable 12-hex-digit digest of :meth:`key_fields`."""
        text = json.dumps(self.key_fields(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def to_json(self) -> str:
        data = asdict(self)
        data["libraries"] = dict(self.libraries)
        data["info"] = dict(self.info)
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Fingerprint:
        data = json.loads(text)
        return cls(**data)


def software_of(fingerprint_json: str) -> dict[str, str] | None:
    """``driver``, ``runtime`` and the library versions of a stored fingerprint (:meth:`Fingerprint.to_json`):
    the software fields the best-config lookup compares. None if the text cannot be read. Pure."""
    try:
        data = json.loads(fingerprint_json)
        libraries = data.get("libraries") or {}
        software = {"driver": str(data.get("driver", "")), "runtime": str(data.get("runtime", ""))}
        software.update({str(k): str(v) for k, v in libraries.items()})
    except (ValueError, AttributeError, TypeError):
        return None
    return software


@dataclass(frozen=True)
class StudyKey:
    template: str
    template_version: str
    shape: Shape
    device_kind: str
    device_name: str
    fingerprint_hash: str

    @classmethod
    def of(cls, template: str, version: str, shape: Shape, fingerprint: Fingerprint) -> StudyKey:
        return cls(template, version, shape, fingerprint.kind, fingerprint.device_name, fingerprint.hash())

    @property
    def shape_key(self) -> str:
        return self.shape.key()

    def study_name(self) -> str:
        """The Optuna study name (unique per key; readable in optuna-dashboard)."""
        return (
            f"{self.template}@{self.template_version}|{self.shape_key}|"
            f"{self.device_kind}:{self.device_name}|fp:{self.fingerprint_hash}"
        )
