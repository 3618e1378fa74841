"""The export file: the store's best configs with what the runtime client needs to use them offline.

``tuner export -o best.json`` writes it; ``tuner.service.client.Client.from_file`` reads it. JSON, schema version 1::

    {
      "format": "tuner-best-configs", "schema_version": 1, "generated_at": "2026-…Z",
      "source": "<store URL, password masked>",
      "templates": {
        "<name>": {
          "version": "1", "backend": "triton",
          "dims": [{"name": "S", "kind": "int", "default": null, "choices": null, "minimum": 1}, …],
          "parameters": ["BLOCK_H", …],
          "default": {…},                                   # the search space's default config
          "constraints": [{"expr": "BLOCK_H < 2 * H", "reason": "…"}, …]   # tuner.expr expressions
        }
      },
      "entries": [ {tuner.service.lookup.Entry fields: template, template_version, shape, device_kind, device_name,
                    config, median_us, p20_us, p80_us, n_samples, timer, fingerprint_hash, measurement_id,
                    published_at}, … ]
    }

Entries are those of each template's current version (the version whose constraints and default are in the
file). Templates without entries are exported too (their default still answers). The client evaluates the
constraints with :mod:`tuner.expr` (pure Python), so nearest configs are checked offline as online.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tuner import db, registry
from tuner.errors import TunerError
from tuner.service.lookup import Entry
from tuner.space import SearchSpace
from tuner.template import KernelTemplate

FORMAT = "tuner-best-configs"
SCHEMA_VERSION = 1


def template_section(template: KernelTemplate, space: SearchSpace) -> dict[str, Any]:
    """What the client needs of one template: version, dims (with defaults), default config, constraints."""
    return {
        "version": template.version,
        "backend": template.backend,
        "dims": [
            {"name": d.name, "kind": d.kind, "default": d.default,
             "choices": list(d.choices) if d.choices else None, "minimum": d.minimum if d.kind == "int" else None}
            for d in template.dims
        ],
        "parameters": list(space.names),
        "default": space.default.to_dict(),
        "constraints": [{"expr": c.expression.source, "reason": c.reason} for c in space.constraints],
    }


def build_export(
    store: db.Store,
    *,
    templates: Sequence[str] | None = None,
    device_kind: str | None = None,
    warn: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """The export document. ``templates``: these (UnknownTemplateError if one is not registered); None:
    every registered template, skipping (with ``warn``) those that do not load. Raises StoreError."""
    sections: dict[str, dict[str, Any]] = {}
    for name in templates if templates is not None else registry.names():
        try:
            t = registry.get(name)
            sections[name] = template_section(t, t.space())
        except (TunerError, ImportError, AttributeError, TypeError) as exc:
            if templates is not None:
                raise
            warn(f"template {name} skipped: {exc}")
    entries: list[dict[str, Any]] = []
    with store.session(readonly=True) as session:
        for name, section in sections.items():
            for r in db.list_best(session, template=name, device_kind=device_kind):
                if r.template_version != section["version"]:
                    continue
                entries.append(Entry(
                    template=r.template, template_version=r.template_version, shape=r.shape,
                    device_kind=r.device_kind, device_name=r.device_name, config=r.config, median_us=r.median_us,
                    p20_us=r.p20_us, p80_us=r.p80_us, n_samples=r.n_samples, timer=r.timer,
                    fingerprint_hash=r.fingerprint_hash, measurement_id=r.measurement_id,
                    published_at=r.published_at.isoformat(),
                ).to_dict())
    return {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "generated_at": datetime.now(timezone.utc).isoformat().replace("+00:00", "Z"),
        "source": store.url,
        "device_kind": device_kind,
        "templates": sections,
        "entries": entries,
    }


def write_export(document: dict[str, Any], path: Path) -> None:
    """Write atomically (a reader never sees half a file): temporary file in the same directory, then rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or Path("."))
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(document, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
