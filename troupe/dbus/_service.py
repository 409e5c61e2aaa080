"""``com.kylin.pixiu.Memory`` on the D-Bus session bus: Write, Query, Forget and SyncStatus
mapped to the same actors and read side as the HTTP surface (the contract's §1 D-Bus row;
the optional ``dbus`` extra).

Why JSON strings over D-Bus: every method takes one string (the HTTP body of the matching
route) and returns one string (the HTTP answer's body), so desktop clients and the HTTP API
share one schema and one set of validation rules (the knowledge surface's pydantic models);
a refusal is a D-Bus error named ``com.kylin.pixiu.Memory.Error.<CODE>`` whose message is the
contract's error body.  ``jeepney`` is pure Python and has a trio API: the service is one task
that receives method calls and answers each in its own task (bounded by
``dbus_calls_concurrent_max``).

Methods (interface ``com.kylin.pixiu.Memory``, object ``/com/kylin/pixiu/Memory``):
``Write(s) → s`` (``/memory/write``), ``Query(s) → s`` (``/memory/query``), ``Forget(s) → s``
(``/forget``), ``SyncStatus() → s`` (``/sync/status``; ``{"enabled": false}`` while the sync
runtime is not installed).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import trio

logger = logging.getLogger("troupe.dbus")

bus_name = "com.kylin.pixiu.Memory"
object_path = "/com/kylin/pixiu/Memory"
interface_name = "com.kylin.pixiu.Memory"
error_prefix = "com.kylin.pixiu.Memory.Error."
dbus_calls_concurrent_max = 16
dbus_request_characters_max = 2 * 1024 * 1024
dbus_ask_timeout_seconds = 60.0
methods = ("Write", "Query", "Forget", "SyncStatus")
name_flag_do_not_queue = 4
name_reply_primary_owner = 1
name_reply_already_owner = 4


class MemoryBusNameTaken(Exception):
    """Another process owns ``bus_name`` on this bus (a second server, the real PIXIU daemon)."""


class MemoryBusError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class MemoryBusService:
    """Answers the four methods from the running server's parts."""

    def __init__(self, env: Any, engine: Any, system: Any) -> None:
        from troupe.http.knowledge import KnowledgeReads

        self.system = system
        self.reads = KnowledgeReads(engine, env, system)

    async def call(self, method: str, argument: str | None) -> dict[str, Any]:
        from troupe.actors.knowledge import KnowledgeRefused, scope_kind_name
        from troupe.http.knowledge import KnowledgeError
        from troupe.http.knowledge._schemas import ForgetIn, MemoryQueryIn, MemoryWriteIn, validated

        try:
            if method == "SyncStatus":
                reply = await self._sync_status()
            else:
                document = _document(argument)
                if method == "Write":
                    write = validated(MemoryWriteIn, document).to_request()
                    reply = await self.system.ref(scope_kind_name, write.scope).ask(
                        write, timeout=dbus_ask_timeout_seconds)
                elif method == "Query":
                    reply = await self.reads.answer(validated(MemoryQueryIn, document).to_request())
                elif method == "Forget":
                    reply = await self.reads.answer(validated(ForgetIn, document).to_request())
                else:
                    raise MemoryBusError("UNKNOWN_METHOD", f"no method {method}")
        except KnowledgeError as error:
            raise MemoryBusError(error.code, error.message) from error
        if isinstance(reply, KnowledgeRefused):
            raise MemoryBusError(reply.code, reply.message)
        return reply if isinstance(reply, dict) else reply.encode()

    async def _sync_status(self) -> Any:
        try:
            from troupe.actors.knowledge.sync import GetSyncStatus, sync_key, sync_kind_name
        except ImportError:
            return {"enabled": False}
        if sync_kind_name not in getattr(self.system, "kinds", ()):
            return {"enabled": False}
        return await self.system.ref(sync_kind_name, sync_key).ask(GetSyncStatus(), timeout=dbus_ask_timeout_seconds)


def _document(argument: str | None) -> Any:
    if argument is None or len(argument) > dbus_request_characters_max:
        raise MemoryBusError("INVALID_REQUEST", "the argument must be a JSON object no longer than "
                                                f"{dbus_request_characters_max} characters")
    try:
        return json.loads(argument)
    except ValueError as exc:
        raise MemoryBusError("INVALID_REQUEST", "the argument is not valid JSON") from exc


async def serve_memory_bus(service: MemoryBusService, bus_address: str = "SESSION", *,
                           task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Own ``bus_name`` on the bus at ``bus_address`` and answer calls until cancelled;
    ``task_status.started()`` once the name is owned."""
    from jeepney import HeaderFields, MessageType, message_bus, new_error, new_method_return
    from jeepney.io.trio import open_dbus_connection

    connection = await open_dbus_connection(bus_address)
    async with connection:
        request = message_bus.RequestName(bus_name, name_flag_do_not_queue)
        request_serial = next(connection.outgoing_serial)
        await connection.send(request, serial=request_serial)
        limiter = trio.Semaphore(dbus_calls_concurrent_max)

        async def answer(message: Any) -> None:
            async with limiter:
                method = message.header.fields.get(HeaderFields.member)
                argument = message.body[0] if message.body and isinstance(message.body[0], str) else None
                try:
                    body = await service.call(method, argument)
                    reply = new_method_return(message, "s", (json.dumps(body, ensure_ascii=False),))
                except MemoryBusError as error:
                    text = json.dumps({"error": error.code, "message": error.message}, ensure_ascii=False)
                    reply = new_error(message, error_prefix + error.code, "s", (text,))
                except Exception as error:  # our bug: the caller gets INTERNAL_ERROR, we keep serving
                    logger.exception("D-Bus call %s failed", method, exc_info=error)
                    reply = new_error(message, error_prefix + "INTERNAL_ERROR", "s",
                                      (json.dumps({"error": "INTERNAL_ERROR", "message": "internal error"}),))
                await connection.send(reply)

        async with trio.open_nursery() as nursery:
            started = False
            while True:
                message = await connection.receive()
                header = message.header
                if not started and header.fields.get(HeaderFields.reply_serial) == request_serial:
                    # The RequestName answer: 1 (primary owner) or 4 (already the owner) make the
                    # name ours; 3 (exists, and we asked not to queue) means someone else has it.
                    code = message.body[0] if header.message_type == MessageType.method_return else None
                    if code not in (name_reply_primary_owner, name_reply_already_owner):
                        raise MemoryBusNameTaken(f"{bus_name} is owned by another process on this bus")
                    task_status.started()
                    started = True
                    continue
                if (header.message_type == MessageType.method_call
                        and header.fields.get(HeaderFields.path) == object_path
                        and header.fields.get(HeaderFields.interface) in (interface_name, None)):
                    nursery.start_soon(answer, message)


__all__ = [
    "MemoryBusError",
    "MemoryBusNameTaken",
    "MemoryBusService",
    "bus_name",
    "dbus_ask_timeout_seconds",
    "dbus_calls_concurrent_max",
    "dbus_request_characters_max",
    "error_prefix",
    "interface_name",
    "methods",
    "object_path",
    "serve_memory_bus",
]
