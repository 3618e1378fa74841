"""The study / best-config key: everything that changes which config is best.

template name + template version, shape (all dims, dtypes and flags), device kind + device name, and the
software fingerprint digest. Studies, measurements and best configs are stored under it; a best config is
served for a key only if it passed the correctness gate under that same fingerprint.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.frozen import Shape
from tuner.measure.devices.base import Fingerprint


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
