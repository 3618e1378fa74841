"""The export file: the store's best configs with what the runtime client needs to use them offline.

``tuner export -o best.json`` writes it; ``tuner.service.client.Client.from_file`` reads it. JSON, schema version 1::

    {
      "format": "tuner-best-configs", "schema_version": 1, "generated_at": "2026-…Z",
      "source": "<store URL, password masked>",
      "templates": {
        "<name>": {
          "version": "1", "carries": ["0"], "backend": "triton",   # carries: earlier versions served here
          "dims": [{"name": "S", "kind": "int", "default": null, "choices": null, "minimum": 1}, …],
          "shape_rules": [{"expr": "S % Q == 0", "message": "…"}, …],   # tuner.expr expressions over dims
          "parameters": ["BLOCK_H", …],
          "domains": [{"name": "BLOCK_H", "kind": "pow2", "choices": [1, 2, 4, …]}, …],  # each parameter's values
          "default": {…},                                   # the search space's default config
          "constraints": [{"expr": "BLOCK_H < 2 * H", "reason": "…"}, …]   # tuner.expr expressions
        }
      },
      "entries": [ {tuner.lookup.Entry fields: template, template_version, shape, device_kind, device_name,
                    config, median_us, p20_us, p80_us, n_samples, timer, fingerprint_hash, measurement_id,
                    published_at, software: {driver, runtime, torch, triton, …}}, … ]
    }

Entries are those of each template's current version (the version whose constraints and default are in the
file) and, where it has none yet for a (device, shape), those of the first listed version it ``carries`` that
has one (:class:`tuner.spec.CarriedVersion`), their configs completed for the current version and their
``template_version`` their own. A reader that does not know ``carries`` (written before it, within schema
version 1) keeps to the current version's entries and serves the default where only a carried entry exists.
Templates without entries are exported too (their default still answers). The client evaluates the
constraints with :mod:`tuner.expr` (pure Python), so nearest configs are checked offline as online, and
validates shapes with the dims and shape rules through :func:`tuner.dims.validate_shape`, as the server does.
``shape_rules``, ``domains`` and the entries' ``software`` were added within schema version 1: readers ignore
fields they do not know, and a file without them validates dims only, compares no software and repairs no
config (an entry's config invalid for the shape is skipped, as the server did before repairs).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tuner import registry
from tuner.errors import TunerError
from tuner.space import SearchSpace
from tuner.spec import TemplateSpec
from tuner.store import TuningStore
from tuner.store.entries import served_entries

FORMAT = "tuner-best-configs"
SCHEMA_VERSION = 1


def template_section(template: TemplateSpec, space: SearchSpace) -> dict[str, Any]:
    """What the client needs of one template: version, dims (with defaults), default config, constraints."""
    return {
        "version": template.version,
        # earlier versions whose entries the file serves (configs completed) where this one has none yet
        "carries": [c.version for c in template.carries],
        "backend": template.backend,
        "dims": [d.to_dict() for d in template.dims],
        "shape_rules": [r.to_dict() for r in template.shape_rules],
        "parameters": list(space.names),
        "domains": [d.to_dict() for d in space.domains],
        "default": space.default.to_dict(),
        "constraints": [{"expr": c.expression.source, "reason": c.reason} for c in space.constraints],
    }


def build_export(
    store: TuningStore,
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
            t = registry.spec(name)
            sections[name] = template_section(t, t.space())
        except (TunerError, ImportError, AttributeError, TypeError) as exc:
            if templates is not None:
                raise
            warn(f"template {name} skipped: {exc}")
    entries: list[dict[str, Any]] = []
    for name in sections:
        spec = registry.spec(name)
        found = served_entries(store, template=name, device_kind=device_kind, version=spec.version,
                               carries=spec.carries, admits=spec.space().in_domain)
        entries.extend(entry.to_dict() for _, entry in found)
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
    """Write atomically (a reader never sees half a file): temporary file in the same directory, then rename.
    The file gets the mode a plain ``open(path, "w")`` would give it (0666 less the umask), not mkstemp's
    0600: it is shipped to the runtime clients, which may run as other users. Thread-safe (the temporary
    file's name is unique)."""
    path = Path(path)
    tmp = (path.parent or Path(".")) / f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as to open()
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(document, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
