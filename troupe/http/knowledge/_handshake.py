"""The handshake facts: ``/version``, ``/health`` and ``/capabilities`` (§3.0a, §3.0).

Why each fact comes from where it does:

- ``product_version`` is injected at packaging: the release's service unit sets
  ``TROUPE_PRODUCT_VERSION`` (a systemd ``Environment=`` line).  Run from source with nothing
  injected, it is ``development``: never guessed from a package's metadata, because an
  editable install reports a version that was never released (Module E fails closed on a
  mismatch, which is the point).  A malformed injected value is ignored (``development``).
- ``schema_version`` is the newest ``knowledge`` migration the database has applied
  (``schema_migrations``), compared with the one this code needs
  (``knowledge_schema_version``): behind → ``/health`` answers 503 ``SCHEMA_NOT_READY`` and
  every non-handshake route refuses the same way.  Migrations only move forward inside a
  process, so once ready the answer is cached and costs nothing per request.
- ``/capabilities`` reports facts without hosts, addresses or paths: the platform family and
  major version (``/etc/os-release``'s ``ID`` and ``VERSION_ID``, read once at start), and for
  the embedding and the vector store what was configured (``TROUPE_KNOWLEDGE_EMBEDDING``,
  ``TROUPE_KNOWLEDGE_VECTOR_STORE``: ``auto`` by default) against what actually runs (the
  Env's embedder by name, ``none`` without one; the recall engine's ``usearch`` index).
  ``contest_ready`` is true only on Kylin V11 with both runtimes ``kylin``, which this build
  cannot be: it has no Kylin adapter.  So configuring ``kylin`` strictly fails the start
  (``KnowledgeBackendUnavailable``) instead of degrading silently, as the contract requires.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import apsw

from troupe.actors.knowledge import (
    BackendCapability,
    Capabilities,
    HealthReport,
    VersionInfo,
    knowledge_component,
    knowledge_schema_version,
    product_version_development,
)
from troupe.server import ServeError

product_version_variable = "TROUPE_PRODUCT_VERSION"
embedding_variable = "TROUPE_KNOWLEDGE_EMBEDDING"
vector_store_variable = "TROUPE_KNOWLEDGE_VECTOR_STORE"
os_release_path = "/etc/os-release"
product_version_pattern = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+~-]{0,63}")
backend_choices = ("auto", "local", "kylin")
backend_kylin = "kylin"
vector_store_runtime = "usearch"
"""The recall engine's vector index (``troupe.retrieval``)."""
embedding_runtime_none = "none"
platform_unknown = "unknown"
platform_field_characters_max = 32


class KnowledgeBackendUnavailable(ServeError):
    """A backend configured strictly (``kylin``) cannot be instantiated: the server does not
    start (the contract's start-up pre-check)."""


def product_version(environ: Mapping[str, str]) -> str:
    text = environ.get(product_version_variable, "").strip()
    return text if product_version_pattern.fullmatch(text) else product_version_development


def _os_release_fields(text: str) -> dict[str, str]:
    fields = {}
    for line in text.splitlines():
        name, separator, value = line.partition("=")
        if separator:
            fields[name.strip()] = value.strip().strip('"').strip("'")
    return fields


def _platform_word(value: str) -> str:
    word = re.sub(r"[^0-9a-z._-]", "", value.lower())[:platform_field_characters_max]
    return word or platform_unknown


def platform_facts(os_release_text: str | None) -> tuple[str, str]:
    """``(family, version_major)`` from an os-release text (``unknown`` when absent)."""
    if not os_release_text:
        return platform_unknown, platform_unknown
    fields = _os_release_fields(os_release_text)
    family = _platform_word(fields.get("ID", ""))
    version = fields.get("VERSION_ID", "").lstrip("Vv")
    major = _platform_word(version.split(".")[0]) if version else platform_unknown
    return family, major


def read_os_release(path: str = os_release_path) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            return file.read(64 * 1024)
    except OSError:
        return None


def configured_backend(environ: Mapping[str, str], variable: str) -> str:
    value = environ.get(variable, "").strip().lower() or "auto"
    if value not in backend_choices:
        raise KnowledgeBackendUnavailable(f"{variable} must be one of {', '.join(backend_choices)}, got {value!r}")
    if value == backend_kylin:
        raise KnowledgeBackendUnavailable(
            f"{variable}=kylin: this build has no Kylin adapter; use auto or local")
    return value


@dataclass(frozen=True)
class HandshakeSettings:
    """What the surface learnt at start (no host names, addresses or paths)."""

    product_version: str = product_version_development
    platform_family: str = platform_unknown
    platform_version_major: str = platform_unknown
    embedding_configured: str = "auto"
    vector_store_configured: str = "auto"

    @classmethod
    def from_environment(cls, environ: Mapping[str, str], os_release_text: str | None) -> HandshakeSettings:
        family, major = platform_facts(os_release_text)
        return cls(product_version=product_version(environ), platform_family=family,
                   platform_version_major=major,
                   embedding_configured=configured_backend(environ, embedding_variable),
                   vector_store_configured=configured_backend(environ, vector_store_variable))


def applied_schema_version(connection: apsw.Connection) -> int:
    row = connection.execute("SELECT MAX(number) FROM schema_migrations WHERE component = ?",
                             (knowledge_component,)).fetchone()
    return 0 if row is None or row[0] is None else int(row[0])


class SchemaState:
    """The database's knowledge schema version against the code's, cached once ready."""

    def __init__(self, engine: Any, required: int = knowledge_schema_version) -> None:
        self.engine = engine
        self.required = required
        self._ready_version: int | None = None

    async def version(self) -> int:
        if self._ready_version is not None:
            return self._ready_version
        version = await self.engine.read(applied_schema_version)
        if version >= self.required:
            self._ready_version = version
        return version

    async def ready(self) -> bool:
        return await self.version() >= self.required


def version_info(settings: HandshakeSettings, schema_version: int) -> VersionInfo:
    return VersionInfo(product_version=settings.product_version, schema_version=schema_version)


def health_report(settings: HandshakeSettings, schema_version: int) -> HealthReport:
    return HealthReport(product_version=settings.product_version, schema_version=schema_version)


def capabilities(settings: HandshakeSettings, embedder: Any) -> Capabilities:
    embedding_runtime = embedding_runtime_none if embedder is None else _platform_word(
        str(getattr(embedder, "name", "")) or "custom")
    return Capabilities(
        platform_family=settings.platform_family,
        platform_version_major=settings.platform_version_major,
        embedding=BackendCapability(configured=settings.embedding_configured, runtime=embedding_runtime,
                                    compliant=embedding_runtime == backend_kylin),
        vector_store=BackendCapability(configured=settings.vector_store_configured, runtime=vector_store_runtime,
                                       compliant=vector_store_runtime == backend_kylin),
    )


__all__ = [
    "HandshakeSettings",
    "KnowledgeBackendUnavailable",
    "SchemaState",
    "applied_schema_version",
    "backend_choices",
    "capabilities",
    "configured_backend",
    "embedding_variable",
    "health_report",
    "platform_facts",
    "product_version",
    "product_version_variable",
    "read_os_release",
    "vector_store_variable",
    "version_info",
]
