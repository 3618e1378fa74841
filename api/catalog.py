"""Template specs and their search spaces, loaded once per process and shared by every request.

The API reads template specs (:mod:`tuner.spec`), never the implementations: it imports no torch, Triton
or TileLang. Loading a space parses YAML, too slow for a request path, so the first request (or the
start-up warm-up) pays and later ones read a dict. Entries are immutable; the catalog is thread-safe.
Failures are not cached, so a template fixed on disk is picked up by the next request (a template that
loaded stays as it was loaded).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from tuner import registry
from tuner.errors import TunerError
from tuner.space import SearchSpace
from tuner.spec import TemplateSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CatalogEntry:
    """One template's spec with its validated search space."""

    spec: TemplateSpec
    space: SearchSpace

    @property
    def name(self) -> str:
        return self.spec.name


class Catalog:
    """Name → :class:`CatalogEntry`, filled on first use."""

    def __init__(self) -> None:
        self._entries: dict[str, CatalogEntry] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> CatalogEntry:
        """The entry of a registered template.

        Raises UnknownTemplateError (not registered), SearchSpaceError (its space file is invalid); an
        import failure of the kernel module propagates as the ImportError/AttributeError Python raised.
        """
        entry = self._entries.get(name)  # lock-free hit: dict reads are atomic
        if entry is not None:
            return entry
        with self._lock:
            entry = self._entries.get(name)
            if entry is None:
                spec = registry.spec(name)
                entry = CatalogEntry(spec, spec.space())
                self._entries[name] = entry
        return entry

    def names(self) -> list[str]:
        return registry.names()

    def warm(self) -> None:
        """Load every registered template now; log (never raise) those that fail."""
        for name in self.names():
            try:
                self.get(name)
            except (TunerError, ImportError, AttributeError, TypeError) as exc:
                log.warning("template %s does not load: %s", name, exc)
