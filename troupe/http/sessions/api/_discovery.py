"""Discovery and fences: deployment capabilities, the session-family discovery and the
per-session capability closure with its id.

Why a closure: the SDK reads ``GET /api/sessions/:id/capabilities`` before every write, refuses
to write an operation that is not ``enabled``, and sends the closure id back in
``tansr-closure-id``; a write whose closure id is no longer the current one is refused with 412
``precondition_failed`` (``closure_stale``, ``rediscover``) so a client never writes under
assumptions the server no longer holds.  The id is
``sha256("tansr.unified.closure.v1" ‖ 0x00 ‖ canonical({authorizationRevision, domains,
operations}))`` over sorted-key compact JSON: no time in it, the same inputs give the same id,
so it stays stable for a live session and changes only when what is enabled changes (the session
ended, the deployment's voice or cwd policy differs).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ._manifest import api_operations
from ._transport import (
    contract_name,
    manifest_revision,
    schema_hash_header_value,
    session_contract_family,
)

closure_domains = ("session", "execution", "archive", "archive-sync", "cache", "terminal",
                   "terminal-observation", "terminal-profile")

closure_operation_names: tuple[str, ...] = (
    "session.create", "session.list", "session.get", "session.close", "session.message.send",
    "session.events.observe", "session.interrupt", "session.history.read", "session.tool.result",
    "session.permission.decide", "session.question.answer", "session.compact", "session.checkpoint.list",
    "session.checkpoint.create", "session.checkpoint.import", "session.checkpoint.restore",
    "session.checkpoint.export", "session.checkpoint.delete", "session.cwd.set", "session.audio.transcribe",
    "session.audio.speak", "session.input.capabilities", "session.input.submit", "session.input.status",
    "approval.credential.submit", "execution.initialize", "execution.capabilities", "execution.boundary",
    "execution.binding.create", "execution.status", "executor.register", "executor.heartbeat",
    "executor.operations.poll", "executor.receipt.submit", "archive.capabilities", "archive.binding.target",
    "archive.binding.create", "archive.binding.get", "archive.binding.close", "archive.status",
    "archive.events.observe", "archive.records.read", "archive.artifact.read", "archive.ack.commit",
    "archive.ack.rebase", "archive.operation.query", "archive.sync", "material.response.submit",
    "material.status", "material.upload.status", "material.upload.chunk", "cache.capabilities",
    "cache.binding.open", "cache.binding.get", "cache.binding.renew", "cache.binding.rebind",
    "cache.binding.rotate", "cache.binding.close", "cache.operation.query", "cache.diagnostics",
    "cache.core.diagnostics", "terminal.capabilities", "terminal.binding.create",
    "terminal.executor.events.observe", "terminal.output.batch", "terminal.execution.state",
    "terminal.output.observe", "terminal.output.status", "terminal.configuration.read",
    "terminal.configuration.commit", "terminal.memory.read", "terminal.memory.command",
    "terminal.memory.receipt", "terminal.observation.resources", "terminal.observation.correlations",
    "terminal.profile.catalog", "terminal.profile.usage",
)
"""Every operation a closure states (the contract's 77, in its order)."""

closure_prefix = b"tansr.unified.closure.v1\x00"
ended_writes_kept = frozenset({"session.create", "session.close", "session.checkpoint.list",
                               "session.checkpoint.export"})
"""Writes an ended session still allows (create = resume; close is idempotent)."""

assert len(closure_operation_names) == 77 == len(set(closure_operation_names))


def canonical_bytes(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def operation_states(*, served: frozenset[str], disabled: frozenset[str] = frozenset()) -> dict[str, str]:
    """Each closure operation → ``enabled`` (served and allowed), ``disabled`` (served, not now)
    or ``unavailable`` (not served by this deployment)."""
    states = {}
    for name in closure_operation_names:
        if name not in served:
            states[name] = "unavailable"
        elif name in disabled:
            states[name] = "disabled"
        else:
            states[name] = "enabled"
    return states


def closure_document(operations: dict[str, str], authorization_revision: str | None = None) -> dict[str, Any]:
    """The ``CapabilityClosure`` body, its ``closureId`` computed from the rest."""
    domains = {name: {"installed": name == "session",
                      "revision": "sdk1" if name == "session" else None} for name in closure_domains}
    content = {"authorizationRevision": authorization_revision, "domains": domains, "operations": operations}
    closure_id = hashlib.sha256(closure_prefix + canonical_bytes(content)).hexdigest()
    return {"contract": contract_name, "closureId": closure_id, **content}


def deployment_capabilities() -> dict[str, Any]:
    """``GET /api/capabilities``: the session domain installed, the rest not."""
    session_ops = [operation for operation in api_operations if operation.family is not None]
    assert session_ops
    absent = {"installed": False, "status": "unregistered", "schemaHash": "none"}
    return {
        "contract": contract_name,
        "manifestRevision": manifest_revision,
        "schemaHash": schema_hash_header_value,
        "domains": {
            "session": {"installed": True, "family": {"preferred": "sdk1", "available": ["sdk1"]},
                        "contract": session_contract_family, "status": "frozen", "schemaHash": "none"},
            "execution": {**absent, "contract": "sdk2-ext-v1"},
            "archive": {**absent, "contract": "sdk2-ext-v1"},
            "archive-sync": {**absent, "contract": "archive-sync-v1"},
            "cache": {**absent, "contract": "sdk2-cache-v1"},
            "terminal": {**absent, "contract": "terminal-services-v1"},
            "terminal-observation": {**absent, "contract": "terminal-observation-v1"},
            "terminal-profile": {**absent, "contract": "terminal-profile-v1"},
        },
    }


def session_family_discovery(protocol: str) -> dict[str, Any]:
    """``GET /api/capabilities/sessions?protocol=``: the families this deployment runs."""
    return {"protocol": protocol, "contracts": [{"contract": "sdk1", "availability": "legacy-complete"}]}


__all__ = [
    "canonical_bytes",
    "closure_document",
    "closure_domains",
    "closure_operation_names",
    "closure_prefix",
    "deployment_capabilities",
    "ended_writes_kept",
    "operation_states",
    "session_family_discovery",
]
