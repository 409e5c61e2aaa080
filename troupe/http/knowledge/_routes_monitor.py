"""``/monitor/config`` (GET, PUT) and ``/monitor/log``: the monitor's HTTP side (§3.18–3.20).

A thin adapter like the rest of the surface: the configuration goes to the monitor actor
``("knowledge_monitor", "main")``, the one owner of the configuration and the watcher (so a
PUT is persisted, logged and applied in one turn); the log is a plain storage read (newest
first).  A PUT body that is not a configuration the monitor can apply exactly is 400
``INVALID_REQUEST`` and changes nothing.

The monitor actor is activated when the app starts serving (``EnsureMonitor``), so a
configuration saved before a restart starts watching again without waiting for a request.
"""

from __future__ import annotations

import logging
from typing import Any

from quart import Response, request

from troupe.actors.knowledge.monitor import (
    EnsureMonitor,
    GetMonitorConfig,
    MonitorConfigInvalid,
    PutMonitorConfig,
    list_log,
    monitor_key,
    monitor_kind_name,
    monitor_log_limit_default,
    monitor_log_limit_problem,
    parse_monitor_config,
)
from troupe.runtime import Overloaded, Unavailable

from ._errors import KnowledgeError, code_invalid_request

logger = logging.getLogger("troupe.knowledge")


def install_monitor_routes(app: Any, dependencies: Any) -> None:
    from ._app import _asker, _body, _register, answered, json_response

    ask = _asker(dependencies.system)

    @_register(app, "monitor_config")
    async def monitor_config() -> Response:
        return answered(await ask(monitor_kind_name, monitor_key, GetMonitorConfig()))

    @_register(app, "monitor_config_put")
    async def monitor_config_put() -> Response:
        try:
            config = parse_monitor_config(await _body())
        except MonitorConfigInvalid as exc:
            raise KnowledgeError(code_invalid_request, str(exc)) from exc
        return answered(await ask(monitor_kind_name, monitor_key, PutMonitorConfig(config)))

    @_register(app, "monitor_log")
    async def monitor_log() -> Response:
        problem = monitor_log_limit_problem(request.args)
        if problem is not None:
            raise KnowledgeError(code_invalid_request, problem)
        limit = int(request.args.get("limit", monitor_log_limit_default))
        offset = int(request.args.get("offset", 0))
        page = await dependencies.engine.read(lambda connection: list_log(connection, limit=limit, offset=offset))
        return json_response(page.encode())

    @app.before_serving
    async def start_monitor() -> None:
        try:
            dependencies.system.ref(monitor_kind_name, monitor_key).tell(EnsureMonitor())
        except (Overloaded, Unavailable):
            logger.warning("the monitor could not be started; it starts with the first monitor request")


__all__ = ["install_monitor_routes"]
