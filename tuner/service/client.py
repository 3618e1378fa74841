"""The runtime client: which config to launch a kernel with, from the tuner server or an export file.

Light by design: imports neither torch, nor the store, nor templates (``httpx`` only when it first talks
to a server); the lookup itself is :func:`tuner.lookup.choose`, shared with the server. Usage::

    from tuner.service.client import Client, triton_launch_kwargs

    tuner = Client("http://tuner:8000", ttl_s=60)            # online (token only to enqueue jobs)
    tuner = Client.from_file("best.json")                     # offline, from `tuner export`
    tuner = Client("http://tuner:8000", file="best.json")     # online, the file when the server is down

    best = tuner.best("mamba2_chunk_cumsum", {"B": 1, "S": 4096, "H": 48}, device="cuda")
    best.config, best.match, best.median_us                   # match: exact | nearest | default
    kernel[grid](*args, **triton_launch_kwargs(best.config, kernel))

Answers are cached in the process for ``ttl_s`` seconds, keyed by everything in the request (template,
shape items, device, device name); a cached answer costs one dict lookup (about a microsecond). Where an
answer comes from, in order: the server (``source="server"``; its 4xx answers raise :class:`ClientError`,
but for 408 and 429, which say it is busy, and 401/403 for the token, below), the export file (``"file"``)
when there is no server, it failed or it was busy (then it is not asked again for
``retry_s`` seconds), the caller's ``fallback`` config (``"fallback"``, cached for ``retry_s`` only), else
:class:`ClientError`. With ``enqueue_on_miss=True`` (and a token with the ``submit`` scope), an answer that
is not exact, or is a carried version's best (:attr:`BestConfig.carried`: not tuned under the current
version), submits a background tuning job for the shape, once per shape and process, unless the server
already lists a queued or running tune job for that shape and device (another process's); the call never
waits for it and a failure is only logged.

A token the server refuses (401 unknown, 403 lacking the read scope: a rotated or mistyped token) never stops a
lookup: it is logged once and dropped, and the client reads without it (reads are open unless the server sets
``TUNER_READ_REQUIRES_TOKEN``) and enqueues nothing more. Where the server wants a token for reads too, the
export file answers, else the caller's ``fallback`` (with a warning every ``retry_s``), else ClientError says so.

The requester's fingerprint: ``device_name`` (given, or torch's current device when ``device="auto"``) and
``software`` — by default (``software="auto"``) the installed torch, triton and tilelang versions (package
metadata, nothing imported), and on CUDA, if torch is already imported, its CUDA runtime version and (when
``nvidia-ml-py`` is installed) the driver version. It is sent as ``device_name=…&software=driver=…,runtime=…``
and compared alike online and offline (:mod:`tuner.lookup`): an entry verified on another device name or
software is answered ``nearest``, never ``exact``, with :attr:`BestConfig.differences` saying what differs.
``software=None`` sends none (software is then not compared, as with older clients).

A nearest entry's config invalid for the requested shape is repaired offline as online (the export file
carries the parameters' domains; :attr:`BestConfig.repaired` lists the changes): see :mod:`tuner.lookup`.

Shapes are validated offline exactly as the server does (:func:`tuner.dims.validate_shape` over the dims
and shape rules of the export file): a shape the server rejects with 422 raises ClientError(status=422)
offline too.

Thread-safe: the cache is a dict (atomic operations under the GIL); concurrent misses may ask twice.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from tuner.dims import Dim, ShapeRule, validate_shape
from tuner.distance import DEFAULT_DISTANCE
from tuner.errors import ShapeError
from tuner.expr import Expression, ExpressionError
from tuner.lookup import (
    CUDA_ONLY_SOFTWARE,
    Answer,
    ConfigChange,
    ConstraintCheck,
    Difference,
    Domain,
    Entry,
    Requester,
    choose,
    fit_distance,
    served_notes,
)

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)
Source = Literal["server", "file", "fallback"]
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
SUPPORTED_SCHEMA = 1
# a server (or a proxy before it) busy now, not refusing the request: answered as an outage is
BUSY = frozenset({408, 429})
REFUSED = frozenset({401, 403})  # the token: unknown, or lacking the read scope


class ClientError(Exception):
    """No answer could be given: the server refused the request (``status`` set: 4xx), or neither a server,
    an export file nor a fallback config could answer (``status`` None)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class BestConfig:
    """The config to launch with, and where it comes from. Immutable (``config`` is a read-only mapping)."""

    template: str
    shape: Mapping[str, Any]  # the requested shape, completed with the template's defaults where known
    device_kind: str
    match: Literal["exact", "nearest", "default"]
    config: Mapping[str, Any]
    source: Source
    device_name: str | None = None  # where the config was measured (None for a default)
    distance: float | None = None
    median_us: float | None = None
    p20_us: float | None = None
    p80_us: float | None = None
    n_samples: int | None = None
    timer: str | None = None
    measurement_id: int | None = None
    fingerprint: str | None = None
    published_at: str | None = None
    source_shape: Mapping[str, Any] | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    differences: tuple[Difference, ...] = ()  # what differs from the request (empty when exact)
    unchecked: tuple[str, ...] = ()  # fingerprint fields the request did not give (not compared)
    repaired: tuple[ConfigChange, ...] = ()  # parameters changed from the entry's config, invalid for this shape
    template_version: str | None = None  # the version answered for (None: a fallback, or an older server)
    measured_version: str | None = None  # the version the entry was measured under (None for a default)

    @property
    def carried(self) -> bool:
        """Whether the config is a best of an earlier template version, served until the current one has its
        own here (:class:`tuner.spec.CarriedVersion`): not tuned under this version, so a miss to enqueue."""
        return None not in (self.template_version, self.measured_version) and (
            self.template_version != self.measured_version)

    def launch_kwargs(self, kernel: object | None = None) -> dict[str, Any]:
        """:func:`triton_launch_kwargs` of this config."""
        return triton_launch_kwargs(self.config, kernel)


def split_launch_config(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(meta, options)``: constexpr meta-parameters, and Triton's launch options (num_warps, num_stages,
    num_ctas, maxnreg), which are not kernel arguments."""
    meta = {k: v for k, v in config.items() if k not in LAUNCH_OPTIONS}
    options = {k: v for k, v in config.items() if k in LAUNCH_OPTIONS}
    return meta, options


def server_base(url: str) -> str:
    """``url`` as a server's base address, the API's paths (``/v1/...``) to be added to it, without a trailing
    slash. Raises ClientError for an address without its scheme (``127.0.0.1:8000``) or one that ends in the
    API's ``/v1`` (its requests would go to ``/v1/v1/...`` and come back as a bare 404). Pure."""
    base = url.strip().rstrip("/")
    parts = urllib.parse.urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ClientError(f"server address {url!r}: give it with its scheme, e.g. http://127.0.0.1:8000")
    if parts.path.endswith("/v1"):
        raise ClientError(f"server address {url!r}: give the server's base address, {base[:-len('/v1')]}, "
                          "without /v1 (the API's paths are added to it)")
    return base


def triton_launch_kwargs(config: Mapping[str, Any], kernel: object | None = None) -> dict[str, Any]:
    """Keyword arguments for ``kernel[grid](*args, **kwargs)``: the launch options, and the meta-parameters
    — only those ``kernel`` declares (its ``arg_names``), when a kernel is given, since a template's config
    may hold parameters its Python wrapper reads (layouts, flags) that the Triton function does not take."""
    meta, options = split_launch_config(config)
    names = getattr(kernel, "arg_names", None) if kernel is not None else None
    if names:
        meta = {k: v for k, v in meta.items() if k in names}
    return {**meta, **options}


class ExportFile:
    """An export file (``tuner export``), loaded: entries per template, defaults, compiled constraints."""

    def __init__(self, data: Mapping[str, Any], source: str = "<memory>") -> None:
        if data.get("format") != "tuner-best-configs" or data.get("schema_version") != SUPPORTED_SCHEMA:
            raise ClientError(f"{source}: not a tuner export file of schema version {SUPPORTED_SCHEMA}")
        self.source = source
        self.templates: dict[str, Mapping[str, Any]] = dict(data.get("templates", {}))
        try:
            self._checks = {
                name: ConstraintCheck(tuple(Expression.parse(c["expr"]) for c in section.get("constraints", ())))
                for name, section in self.templates.items()
            }
            self._dims = {name: tuple(Dim.from_dict(d) for d in section["dims"])
                          for name, section in self.templates.items()}
            self._rules = {name: tuple(ShapeRule.from_dict(r) for r in section.get("shape_rules", ()))
                           for name, section in self.templates.items()}
            self._domains = {name: tuple(Domain.from_dict(d) for d in section["domains"])
                             for name, section in self.templates.items() if "domains" in section}
        except (ExpressionError, KeyError, TypeError, ValueError) as exc:
            raise ClientError(f"{source}: malformed template section ({exc})") from None
        self._entries: dict[tuple[str, str], list[Entry]] = {}
        for raw in data.get("entries", ()):
            entry = Entry.from_dict(raw)
            section = self.templates.get(entry.template)
            if section is not None and (section.get("version") == entry.template_version
                                        or entry.template_version in section.get("carries", ())):
                self._entries.setdefault((entry.template, entry.device_kind), []).append(entry)
        # The lookup's distance fitted once per (template, device kind), over the same entries as the server's.
        self._distances = {key: fit_distance(DEFAULT_DISTANCE, found) for key, found in self._entries.items()}

    @classmethod
    def load(cls, path: str | Path) -> ExportFile:
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ClientError(f"no export file {path}: write it with `tuner export -o {path}`") from None
        except (OSError, ValueError) as exc:
            raise ClientError(f"cannot read export file {path}: {exc}") from None
        if not isinstance(data, dict):
            raise ClientError(f"{path}: not a tuner export file")
        return cls(data, str(path))

    def complete(self, template: str, shape: Mapping[str, Any]) -> dict[str, Any]:
        """The shape validated and completed as the server does (:func:`tuner.dims.validate_shape`):
        ClientError 404 for a template the file does not know, 422 for a shape the server would reject."""
        if template not in self.templates:
            raise ClientError(f"template {template!r} is not in {self.source}", 404)
        try:
            return dict(validate_shape(template, self._dims[template], self._rules[template], shape))
        except ShapeError as exc:
            raise ClientError(f"{template}: {exc}", 422) from None

    def valid(self, template: str, config: Mapping[str, Any], shape: Mapping[str, Any]) -> bool:
        return self._checks[template](config, shape) if template in self._checks else True

    def answer(self, template: str, shape: Mapping[str, Any], device_kind: str, device_name: str | None,
               software: Mapping[str, str] | None = None) -> Answer:
        full = self.complete(template, shape)
        section = self.templates[template]
        requester = Requester(device_name, dict(software or {}), None, section.get("backend"))
        answer = choose(
            full, self._entries.get((template, device_kind), []), default=section.get("default"),
            valid=self._checks.get(template), requester=requester, domains=self._domains.get(template),
            distance=self._distances.get((template, device_kind), DEFAULT_DISTANCE), version=section.get("version"),
        )
        if answer is None:
            raise ClientError(f"{self.source} has neither a config nor a default for {template}")
        return answer


class Client:
    """Best-config lookups with an in-process TTL cache. See the module docstring for the answer chain."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        ttl_s: float = 60.0,
        *,
        file: str | Path | ExportFile | None = None,
        timeout_s: float = 2.0,
        retry_s: float = 5.0,
        enqueue_on_miss: bool = False,
        enqueue_job: Mapping[str, Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
        software: Mapping[str, str] | Literal["auto"] | None = "auto",
    ) -> None:
        """``enqueue_job``: fields of the background job (``trials``, ``sampler``…; see ``POST /v1/jobs``).
        ``clock``: seconds, monotonic (injectable for tests). ``software``: the requester's driver, runtime
        and library versions (``"auto"``: detected on first use, see the module docstring; None: not sent).
        Raises ClientError for an unreadable file or a ``url`` that is not a server's base address
        (:func:`server_base`)."""
        if url is None and file is None:
            raise ClientError("give a server url, an export file, or both")
        self.url = server_base(url) if url else None
        self.ttl_s, self.timeout_s, self.retry_s = ttl_s, timeout_s, retry_s
        self.file = file if isinstance(file, ExportFile) or file is None else ExportFile.load(file)
        self.enqueue_on_miss, self.enqueue_job = enqueue_on_miss, dict(enqueue_job or {})
        self._token, self._clock = token, clock
        self._cache: dict[tuple[Any, ...], tuple[float, BestConfig]] = {}
        self._down_until = 0.0
        self._http: httpx.Client | None = None
        self._lock = threading.Lock()
        self._enqueued: set[tuple[Any, ...]] = set()
        self._auto: tuple[str, str | None] | None = None
        self._software = software
        self._token_refused: str | None = None  # the server's reason, once it refused the token

    @classmethod
    def from_file(cls, path: str | Path, ttl_s: float = 60.0, **kwargs: Any) -> Client:
        """An offline client answering from an export file."""
        return cls(None, ttl_s=ttl_s, file=path, **kwargs)

    def best(
        self,
        template: str,
        shape: Mapping[str, Any],
        device: str = "auto",
        device_name: str | None = None,
        *,
        fallback: Mapping[str, Any] | None = None,
    ) -> BestConfig:
        """The config for ``shape`` on ``device`` (``auto``: torch's current device if torch is already
        imported, else ``cpu``; ``device_name`` prefers configs measured on it). Raises ClientError."""
        key = (template, tuple(shape.items()), device, device_name)
        hit = self._cache.get(key)
        if hit is not None and hit[0] > self._clock():
            return hit[1]
        return self._miss(key, template, shape, device, device_name, fallback)

    def invalidate(self) -> None:
        """Forget every cached answer."""
        self._cache = {}

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- misses -----------------------------------------------------------------------------------
    def _miss(self, key: tuple[Any, ...], template: str, shape: Mapping[str, Any], device: str,
              device_name: str | None, fallback: Mapping[str, Any] | None) -> BestConfig:
        kind, name = self._device(device, device_name)
        software = self.software(kind)
        ttl = self.ttl_s
        result: BestConfig | None = None
        if self.url is not None and self._clock() >= self._down_until:
            result = self._from_server(template, shape, kind, name, software, fallback is not None)
        if result is None and self.file is not None:
            result = self._from_file(template, shape, kind, name, software, fallback is not None)
        if result is None:
            if fallback is None:
                raise ClientError(f"no answer for {template}: the server is unavailable and there is no export file")
            result = BestConfig(template, MappingProxyType(dict(shape)), kind, "default",
                                MappingProxyType(dict(fallback)), "fallback")
            ttl = min(ttl, self.retry_s)
        self._cache[key] = (self._clock() + ttl, result)
        if self.enqueue_on_miss and (result.match != "exact" or result.carried) and result.source != "fallback":
            self._enqueue(result, name)
        return result

    def software(self, device_kind: str) -> dict[str, str]:
        """The software versions sent with requests for ``device_kind`` (detected once when ``"auto"``)."""
        if self._software == "auto":
            self._software = detect_software()
        found = dict(self._software or {})
        # the CUDA driver and runtime say nothing about other devices
        return {k: v for k, v in found.items() if device_kind == "cuda" or k not in CUDA_ONLY_SOFTWARE}

    def _from_file(self, template: str, shape: Mapping[str, Any], kind: str, name: str | None,
                   software: Mapping[str, str], has_fallback: bool) -> BestConfig | None:
        assert self.file is not None
        try:
            answer = self.file.answer(template, shape, kind, name, software)
        except ClientError as exc:
            if exc.status == 404 and has_fallback:  # a template the file does not know: the caller's fallback
                return None
            raise
        return _from_answer(template, self.file.complete(template, shape), kind, answer,
                            self.file.templates[template].get("version"))

    def _device(self, device: str, device_name: str | None) -> tuple[str, str | None]:
        if device != "auto":
            return device, device_name
        if self._auto is None:
            self._auto = detect_device()
        kind, detected = self._auto
        return kind, device_name or detected

    def _client(self) -> httpx.Client:
        with self._lock:
            if self._http is None:
                import httpx  # here: offline clients never import it

                headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
                self._http = httpx.Client(base_url=self.url or "", timeout=self.timeout_s, headers=headers)
            return self._http

    def _from_server(self, template: str, shape: Mapping[str, Any], kind: str, name: str | None,
                     software: Mapping[str, str], has_fallback: bool = False) -> BestConfig | None:
        """The server's answer; None when it cannot answer now (then it rests for ``retry_s``), or when it
        wants a token for reads that the client lacks and the export file or the caller's fallback can answer."""
        import httpx

        params: list[tuple[str, Any]] = [("template", template), ("device", kind)]
        if name:
            params.append(("device_name", name))
        if software:
            params.append(("software", ",".join(f"{k}={v}" for k, v in sorted(software.items()))))
        params.extend((k, _query_value(v)) for k, v in shape.items())
        try:
            response = self._get_best(params)
        except httpx.HTTPError as exc:
            log.warning("tuner server %s unavailable: %s", self.url, type(exc).__name__)
            self._down_until = self._clock() + self.retry_s
            return None
        if response.status_code in REFUSED:  # refused even without the token: reads need one
            whose = "refused the client's token" if self._token_refused is not None else "the client has none"
            message = (f"{template}: the server {self.url} wants a token with the read scope for lookups and "
                       f"{whose}: {error_message(response)}")
            if self.file is None and not has_fallback:
                raise ClientError(message, response.status_code)
            log.warning("%s; answering from %s", message,
                        self.file.source if self.file is not None else "the caller's fallback config")
            self._down_until = self._clock() + self.retry_s
            return None
        if 400 <= response.status_code < 500 and response.status_code not in BUSY:
            raise ClientError(f"{template}: {error_message(response)}", response.status_code)
        if response.status_code != 200:
            log.warning("tuner server %s answered %s", self.url, response.status_code)
            self._down_until = self._clock() + self.retry_s
            return None
        data = response.json()
        return BestConfig(
            template=data["template"], shape=MappingProxyType(data["shape"]), device_kind=data["device_kind"],
            match=data["match"], config=MappingProxyType(data["config"]), source="server",
            device_name=data.get("device_name"), distance=data.get("distance"), median_us=data.get("median_us"),
            p20_us=data.get("p20_us"), p80_us=data.get("p80_us"), n_samples=data.get("n_samples"),
            timer=data.get("timer"), measurement_id=data.get("measurement_id"), fingerprint=data.get("fingerprint"),
            published_at=data.get("published_at"), source_shape=data.get("source_shape"),
            notes=tuple(data.get("notes", ())),
            differences=tuple(Difference(d["what"], d.get("requested"), d.get("entry"))
                              for d in data.get("differences", ())),
            unchecked=tuple(data.get("unchecked", ())),
            repaired=tuple(ConfigChange(c["param"], c.get("entry"), c.get("served"))
                           for c in data.get("repaired", ())),
            template_version=data.get("template_version"), measured_version=data.get("measured_version"),
        )

    def _get_best(self, params: list[tuple[str, Any]]) -> httpx.Response:
        """GET /v1/best, with the token until the server refuses it, then without (once refused, the token is
        dropped for good, with one warning). Raises httpx.HTTPError."""
        if self._token_refused is not None:
            return self._client().get("/v1/best", params=params, headers={"Authorization": ""})
        response = self._client().get("/v1/best", params=params)
        if response.status_code in REFUSED and self._token:
            self._token_refused = error_message(response)
            log.warning("tuner server %s refused the client's token (%s): reading without it, enqueueing "
                        "no tuning jobs", self.url, self._token_refused)
            response = self._client().get("/v1/best", params=params, headers={"Authorization": ""})
        return response

    def _enqueue(self, result: BestConfig, device_name: str | None) -> None:
        key = (result.template, tuple(sorted(result.shape.items())), result.device_kind, device_name)
        with self._lock:
            if key in self._enqueued or self.url is None or self._token_refused is not None:
                return
            self._enqueued.add(key)
        body = {"trials": 40, **self.enqueue_job, "template": result.template, "shapes": [dict(result.shape)],
                "device": {"kind": result.device_kind, "name": device_name}}
        threading.Thread(target=self._post_job, args=(body,), name="tuner-enqueue", daemon=True).start()

    def _post_job(self, body: dict[str, Any]) -> None:
        try:
            active = self._active_job(body)
            if active is not None:  # another process (or an operator) asked for it already
                log.info("tuning job %s already covers %s", active, body["shapes"][0])
                return
            response = self._client().post("/v1/jobs", json=body)
            if response.status_code != 201:
                log.warning("could not enqueue a tuning job: %s", error_message(response))
            else:
                log.info("enqueued tuning job %s for %s", response.json().get("id"), body["shapes"][0])
        except Exception as exc:  # never let a background submission disturb the caller
            log.warning("could not enqueue a tuning job: %s", type(exc).__name__)


    def _active_job(self, body: Mapping[str, Any]) -> int | None:
        """The id of a queued or running tune job of the same template version, device and shape, if the
        server lists one among its newest 500 per state (best effort: two processes asking at the same
        moment can still both submit). A failed listing is no reason not to submit: None."""
        for state in ("queued", "running"):
            response = self._client().get("/v1/jobs", params={"state": state, "limit": 500})
            if response.status_code != 200:
                return None
            for job in response.json().get("items", ()):
                device = job.get("device") or {}
                if (job.get("kind", "tune") == "tune" and job.get("template") == body["template"]
                        and device.get("kind") == body["device"]["kind"]
                        and device.get("name") == body["device"]["name"]
                        and any(t.get("shape") == body["shapes"][0] for t in job.get("tasks", ()))):
                    return int(job["id"])
        return None


def _from_answer(template: str, shape: Mapping[str, Any], kind: str, answer: Answer,
                 version: str | None = None) -> BestConfig:
    e = answer.entry
    return BestConfig(
        template=template, shape=MappingProxyType(dict(shape)), device_kind=kind, match=answer.match,
        config=MappingProxyType(dict(answer.config)), source="file", device_name=e.device_name if e else None,
        distance=answer.distance, median_us=e.median_us if e else None, p20_us=e.p20_us if e else None,
        p80_us=e.p80_us if e else None, n_samples=e.n_samples if e else None, timer=e.timer if e else None,
        measurement_id=e.measurement_id if e else None, fingerprint=e.fingerprint_hash if e else None,
        published_at=e.published_at if e else None, source_shape=MappingProxyType(dict(e.shape)) if e else None,
        notes=served_notes(answer), differences=answer.differences, unchecked=answer.unchecked,
        repaired=answer.repaired, template_version=version, measured_version=e.template_version if e else None,
    )


def _query_value(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def error_message(response: Any) -> str:
    """One line from an API error response: ``loc: msg`` per field error, or the detail text."""
    try:
        detail = response.json().get("detail")
    except ValueError:
        detail = None
    if isinstance(detail, list):
        return "; ".join(_field(item) for item in detail) or f"HTTP {response.status_code}"
    if isinstance(detail, str):
        return detail
    return f"HTTP {response.status_code}"


def _field(item: Any) -> str:
    if not isinstance(item, Mapping):
        return str(item)
    loc: Iterable[Any] = item.get("loc") or ()
    where = ".".join(str(p) for p in loc if p not in ("body", "query", "path", "header"))
    return f"{where}: {item.get('msg')}" if where else str(item.get("msg"))


def detect_software() -> dict[str, str]:
    """The requester's software as the workers' fingerprints record it (see :mod:`tuner.lookup`): library
    versions from package metadata; the CUDA runtime if torch is already imported; the driver through NVML
    if ``nvidia-ml-py`` is installed. Never imports torch; never raises."""
    from tuner.measure.devices.common import library_versions  # stdlib only: package metadata

    found = {k: v for k, v in library_versions().items() if k != "python"}
    torch = sys.modules.get("torch")
    cuda = getattr(getattr(torch, "version", None), "cuda", None)
    if cuda:
        found["runtime"] = str(cuda)
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        found["driver"] = version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # no NVML here (no GPU, no package): the driver is then not compared
        pass
    return found


def detect_device() -> tuple[str, str | None]:
    """The kind and name of torch's current device, if torch is already imported (never imports it)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                return "cuda", str(torch.cuda.get_device_name(torch.cuda.current_device()))
            npu = getattr(torch, "npu", None)
            if npu is not None and npu.is_available():
                return "npu", str(npu.get_device_name(npu.current_device()))
        except Exception as exc:  # a broken driver must not break a lookup: say so and use the CPU answer
            log.warning("device detection failed (%s); using cpu", exc)
    return "cpu", None
