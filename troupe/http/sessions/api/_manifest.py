"""The ``/api`` route table of the session family and ``GET /api/manifest``.

Why our own table and not the SDK's catalogue: the catalogue names 77 operations of eight
domains; troupe serves the session domain.  The manifest lists what is served here, with the
revision and schema hash the SDK is frozen at (it refuses a discovery answer that differs), and
``runtime.installed`` says which domains are mounted (only ``session``).  Paths use the SDK's
templates (``:id``, ``:targetId``, ``:ticketId``); ``fenced`` operations are those a capability
closure governs.

Shape: each operation carries exactly the keys of the SDK's ``ManifestOperation`` schema (which
forbids any other).  The SDK's own frozen catalogue adds ``fenced`` and ``requestIdPath`` to
every operation, so ``validate_wire("unified-v1", "Manifest", catalogue)`` refuses the
catalogue itself (checked in ``tests/http/sessions/api/test_discovery.py``); the served
manifest leaves those two keys out of the wire form and passes the SDK's ``discovery.manifest``
check.  ``fenced`` stays an attribute here (what the closure governs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._transport import contract_name, manifest_revision, schema_hash_hex, session_contract_family

legacy_family_discovery_path = "/v3/sdk2/session-capabilities"


@dataclass(frozen=True)
class ApiOperation:
    """One operation: catalogue ``name``, ``method``, ``api_path`` template, ``kind``
    (read | write | stream), the query names it declares, the request/response schema refs."""

    name: str
    method: str
    api_path: str
    kind: str
    query: tuple[str, ...] = ()
    request: str | None = None
    response: str | None = None
    domain: str = "session"
    family: str | None = session_contract_family

    @property
    def legacy_path(self) -> str | None:
        if self.family is None:
            return None
        if not self.api_path.startswith("/api/sessions"):
            # The catalogue's legacy entry of the family discovery (a session-family operation
            # must name one).
            return legacy_family_discovery_path
        return "/v2" + self.api_path[len("/api"):].replace(":ticketId", ":targetId")

    @property
    def fenced(self) -> bool:
        return self.family is not None and self.name != "session.capabilities"

    def encode(self) -> dict[str, Any]:
        return {
            "name": self.name, "domain": self.domain, "family": self.family, "method": self.method,
            "apiPath": self.api_path, "aliases": [], "legacyPath": self.legacy_path, "legacyOffloadPath": None,
            "kind": self.kind, "sse": self.kind == "stream", "request": self.request, "response": self.response,
            "query": list(self.query), "notes": None, "etagPath": None, "expectedRevision": None,
        }


def _session(name: str, method: str, path: str, kind: str, *query: str, request: str | None = None,
             response: str | None = None) -> ApiOperation:
    return ApiOperation(name, method, path, kind, tuple(query),
                        None if request is None else f"{session_contract_family}#{request}",
                        None if response is None else f"{session_contract_family}#{response}")


api_operations: tuple[ApiOperation, ...] = (
    ApiOperation("discovery.manifest", "GET", "/api/manifest", "read", domain="discovery", family=None),
    ApiOperation("discovery.capabilities", "GET", "/api/capabilities", "read", domain="discovery", family=None),
    ApiOperation("discovery.session.capabilities", "GET", "/api/sessions/:id/capabilities", "read",
                 domain="discovery", family=None),
    _session("session.capabilities", "GET", "/api/capabilities/sessions", "read", "protocol"),
    _session("session.create", "POST", "/api/sessions", "write", request="CreateSessionBodySchema"),
    _session("session.list", "GET", "/api/sessions", "read", "limit", "offset"),
    _session("session.get", "GET", "/api/sessions/:id", "read", "include", response="V2SessionMetaView"),
    _session("session.close", "DELETE", "/api/sessions/:id", "write"),
    _session("session.message.send", "POST", "/api/sessions/:id/messages", "write", request="MessagesBodySchema"),
    _session("session.events.observe", "GET", "/api/sessions/:id/events", "stream", "exclude"),
    _session("session.interrupt", "POST", "/api/sessions/:id/interrupt", "write"),
    _session("session.history.read", "GET", "/api/sessions/:id/history", "read", "offset", "limit"),
    _session("session.tool.result", "POST", "/api/sessions/:id/tool-results/:targetId", "write",
             request="ToolResultReceiptSchema"),
    _session("session.permission.decide", "POST", "/api/sessions/:id/permission/:ticketId", "write",
             request="PermissionReceiptSchema"),
    _session("session.question.answer", "POST", "/api/sessions/:id/questions/:ticketId", "write",
             request="QuestionReceiptSchema"),
    _session("session.compact", "POST", "/api/sessions/:id/compact", "write", request="CompactBodySchema",
             response="V2CompactResult"),
    _session("session.checkpoint.list", "GET", "/api/sessions/:id/checkpoints", "read", response="V2CheckpointList"),
    _session("session.checkpoint.create", "POST", "/api/sessions/:id/checkpoints", "write",
             request="CheckpointBodySchema", response="V2CheckpointMeta"),
    _session("session.checkpoint.import", "POST", "/api/sessions/:id/checkpoints/import", "write", "label",
             response="V2CheckpointMeta"),
    _session("session.checkpoint.restore", "POST", "/api/sessions/:id/checkpoints/:targetId/restore", "write",
             request="RestoreBodySchema", response="V2RestoreResult"),
    _session("session.checkpoint.export", "GET", "/api/sessions/:id/checkpoints/:targetId/export", "read"),
    _session("session.checkpoint.delete", "DELETE", "/api/sessions/:id/checkpoints/:targetId", "write"),
    _session("session.cwd.set", "POST", "/api/sessions/:id/cwd", "write", request="SetCwdBodySchema",
             response="V2SetCwdResult"),
    _session("session.audio.transcribe", "POST", "/api/sessions/:id/audio/transcriptions", "write",
             request="AudioTranscriptionsBodySchema"),
    _session("session.audio.speak", "POST", "/api/sessions/:id/audio/speech", "write",
             request="AudioSpeechBodySchema"),
    _session("session.input.capabilities", "GET", "/api/sessions/:id/input-capabilities", "read"),
    _session("session.input.submit", "POST", "/api/sessions/:id/inputs", "write", request="SubmitInputBodySchema"),
    _session("session.input.status", "GET", "/api/sessions/:id/inputs/:targetId", "read", "historyEpoch", "turnId"),
)

api_operations_by_name = {operation.name: operation for operation in api_operations}
assert len(api_operations_by_name) == len(api_operations)

input_operation_names = frozenset({"session.input.capabilities", "session.input.submit", "session.input.status"})
"""Served by the input routes (``_routes_inputs``) when they are installed."""


def quart_rule(api_path: str) -> str:
    """``/api/sessions/:id/x`` → ``/api/sessions/<id>/x``."""
    return "/".join(f"<{part[1:]}>" if part.startswith(":") else part for part in api_path.split("/"))


session_family_entry: dict[str, Any] = {
    "id": session_contract_family,
    "domains": ["session"],
    "status": "frozen",
    "rfc": "doc/98-Agent会话服务v2契约冻结件.md",
    "source": "packages/server/src/v2/contract.ts",
    "sha256": "6e1876edc476322e2fc3613958f5b44700bb80ea23550fa794f5729220674f3e",
    "golden": {},
    "generated": [],
    "legacyEntries": ["/v2/sessions", "/v2/sessions/:id/**"],
    "apiEntries": ["/api/sessions", "/api/sessions/:id/**", "/api/capabilities/sessions"],
    "clients": [],
    "requestIdPath": None,
}
"""The session family as the frozen catalogue describes it (id, status and source digest)."""


def manifest_document(installed_operations: frozenset[str] | None = None) -> dict[str, Any]:
    """``GET /api/manifest``: revision 7, the frozen schema hash, the operations served here."""
    operations = [operation.encode() for operation in api_operations
                  if installed_operations is None or operation.name in installed_operations
                  or operation.family is None]
    return {
        "format": "tansr-api-manifest-v1",
        "contract": contract_name,
        "revision": manifest_revision,
        "schemaHash": schema_hash_hex,
        "families": [session_family_entry],
        "operations": operations,
        "capabilities": [],
        "platformApi": [],
        "runtime": {"installed": {"session": "sdk1", "execution": False, "archive": False, "archive-sync": False,
                                  "cache": False, "terminal": False, "terminal-observation": False,
                                  "terminal-profile": False}},
    }


__all__ = [
    "ApiOperation",
    "api_operations",
    "api_operations_by_name",
    "input_operation_names",
    "manifest_document",
    "quart_rule",
    "session_family_entry",
]
