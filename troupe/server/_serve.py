"""``troupe serve``: one process, one actor system, one storage engine, one listener per surface.

Start-up order is chosen so that every failure happens as early and as harmlessly as
possible: resolve and bind every listener (a taken port or a refused non-loopback address
fails before the data directory is touched), open storage (migrations run), start the actor
system, then start hypercorn on the bound sockets and print one line per listener and then
``ready``.  Those stdout lines are an interface that scripts and tests parse::

    listening admin http://127.0.0.1:8700
    ready

Everything else (hypercorn's log, shutdown notes, errors) goes to stderr.

Shutdown (SIGINT or SIGTERM, or ``ServerHandle.request_shutdown``) runs the reverse order:
readiness turns false, the app-level ``ShutdownSignal`` ends open streams cleanly, hypercorn
stops accepting and waits up to ``shutdown_grace_seconds`` for requests in flight, the actor
system drains (every live actor passivates after its queued messages, bounded by
``drain_seconds_max``), and storage closes after committing what was queued.  A second
signal skips the remaining waits; storage is still closed.  Trade-off: requests still
running after the grace period are cancelled rather than waited for indefinitely.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from typing import Any, BinaryIO

import httpx
import hypercorn.trio
import trio
from hypercorn.config import Config as HypercornConfig

from troupe._config import ConfigError, ServeOptions, load_serve_options
from troupe.http import ShutdownSignal
from troupe.models import embedder_from_environment, model_from_configuration
from troupe.runtime import ActorSystem, Tracer, real_env
from troupe.storage import Engine, StorageError

from ._exceptions import ServeError, UnknownSurface
from ._listeners import BoundListener, bind_listener, resolve_listener
from ._process import freeze_startup_heap
from ._surfaces import (
    Surface,
    SurfaceContext,
    create_surface_apps,
    default_surfaces,
    surface_actor_kinds,
    surface_migrations,
    surface_services,
)

outbound_timeout_seconds = 30.0
outbound_limits = httpx.Limits(max_connections=64, max_keepalive_connections=16)
"""Outbound HTTP (model providers, webhooks): every request bounded in time and connections."""

exit_code_ok = 0
exit_code_failed = 1
exit_code_config = 2


def _print_line(line: str) -> None:
    print(line, flush=True)


def _note(line: str) -> None:
    print(f"troupe serve: {line}", file=sys.stderr, flush=True)


@dataclass
class ServerHandle:
    """What ``serve`` hands to ``task_status.started``: where the listeners are and how to
    stop the server without a signal."""

    urls: Mapping[str, str]
    _requested: trio.Event = field(default_factory=trio.Event)

    def request_shutdown(self) -> None:
        self._requested.set()


class ServerState:
    """The running parts and their readiness; the admin surface's ``AdminSource``."""

    def __init__(self) -> None:
        self.engine: Engine | None = None
        self.system: ActorSystem | None = None
        self.storage_open = False
        self.accepting = False

    def readiness(self) -> dict[str, bool]:
        return {
            "storage": self.storage_open,
            "actor_system": self.system is not None and self.system.running,
            "accepting": self.accepting,
        }

    def statistics(self) -> dict[str, Any]:
        system, engine = self.system, self.engine
        return {
            "kinds": system.statistics() if system is not None else {},
            "supervisor_restarts": system.root.restarts if system is not None else 0,
            "supervisor_escalations": system.root.escalations if system is not None else 0,
            "storage": engine.statistics() if engine is not None and self.storage_open else None,
        }


def _plan_listeners(options: ServeOptions, surfaces: Sequence[Surface]) -> list[tuple[Surface, Any]]:
    names = {surface.name for surface in surfaces}
    unknown = sorted(set(options.listen) - names)
    if unknown:
        raise UnknownSurface(
            f"no surface named {', '.join(unknown)} (this build has: {', '.join(sorted(names))})"
        )
    plan = []
    for surface in surfaces:
        address = options.listen.get(surface.name, surface.listen_default)
        if address is not None:
            plan.append((surface, address))
    return plan


async def _bind_all(options: ServeOptions, surfaces: Sequence[Surface]) -> list[tuple[Surface, BoundListener]]:
    resolved = []
    for surface, address in _plan_listeners(options, surfaces):
        entry = await resolve_listener(surface.name, address, allow_non_loopback=options.allow_non_loopback)
        resolved.append((surface, address, entry))
    bound: list[tuple[Surface, BoundListener]] = []
    try:
        for surface, address, entry in resolved:
            bound.append((surface, bind_listener(surface.name, address, entry)))
    except BaseException:
        for _, listener in bound:
            listener.close()
        raise
    return bound


def _hypercorn_config(options: ServeOptions, listener: BoundListener) -> HypercornConfig:
    config = HypercornConfig()
    config.bind = [listener.hand_over()]
    config.graceful_timeout = options.shutdown_grace_seconds
    config.include_server_header = False
    config.accesslog = None
    return config


async def serve(
    options: ServeOptions,
    *,
    surfaces: Sequence[Surface] | None = None,
    handle_signals: bool = True,
    print_line: Callable[[str], None] = _print_line,
    task_status: trio.TaskStatus[ServerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the server until SIGINT/SIGTERM (``handle_signals``) or ``request_shutdown()``.

    ``surfaces`` defaults to ``default_surfaces()``.  ``task_status.started`` receives a
    ``ServerHandle`` after the ``ready`` line was printed.
    """
    surfaces = list(default_surfaces() if surfaces is None else surfaces)
    bound = await _bind_all(options, surfaces)
    try:
        with ExitStack() as stack:
            trace_sink = _open_trace(options, stack)
            signals = stack.enter_context(trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM)) if handle_signals else None
            await _run(options, surfaces, bound, trace_sink, signals, print_line, task_status)
    finally:
        for _, listener in bound:
            listener.close()


def _open_trace(options: ServeOptions, stack: ExitStack) -> BinaryIO | None:
    if not options.trace_file:
        return None
    try:
        return stack.enter_context(open(options.trace_file, "wb"))
    except OSError as exc:
        raise ServeError(f"cannot open trace file {options.trace_file!r}: {exc.strerror or exc}") from exc


async def _run(
    options: ServeOptions,
    surfaces: list[Surface],
    bound: list[tuple[Surface, BoundListener]],
    trace_sink: BinaryIO | None,
    signals: Any,
    print_line: Callable[[str], None],
    task_status: trio.TaskStatus[ServerHandle],
) -> None:
    env = real_env(options.data_dir)
    # The Env's remaining ports: outbound HTTP, the text-generation model and the embedder,
    # chosen by environment variables (docs/models.md, docs/operations.md).
    env.model = model_from_configuration(os.environ)
    env.embedder = embedder_from_environment(os.environ)
    env.http = httpx.AsyncClient(timeout=outbound_timeout_seconds, limits=outbound_limits)
    tracer = Tracer(enabled=True, time_source=env.clock.wall, sink=trace_sink) if trace_sink else None
    state = ServerState()
    shutdown = ShutdownSignal()
    handle = ServerHandle({surface.name: listener.url for surface, listener in bound})
    graceful = trio.CancelScope()

    async with trio.open_nursery() as nursery:
        if signals is not None:
            nursery.start_soon(_watch_signals, signals, handle, graceful)
        state.engine = await Engine.open(env, nursery=nursery, migrations=surface_migrations(surfaces))
        state.storage_open = True
        try:
            system = ActorSystem(
                env,
                surface_actor_kinds(surfaces),
                storage=state.engine,
                tracer=tracer,
                services=surface_services(surfaces),
                transient_errors=(StorageError,),
            )
            state.system = system
            system_scope = trio.CancelScope()
            await nursery.start(_run_system, system, system_scope)
            context = SurfaceContext(options, env, state.engine, system, shutdown, state, handle.request_shutdown,
                                     handle.urls)
            with graceful:
                await _serve_http(options, bound, context, state, shutdown, handle, print_line, task_status)
                with trio.move_on_after(options.drain_seconds_max) as drain_scope:
                    await system.drain()
                if drain_scope.cancelled_caught:
                    _note(f"actors still busy after {options.drain_seconds_max}s; stopping them")
            system_scope.cancel()
        finally:
            state.storage_open = False
            with trio.CancelScope(shield=True):
                await env.http.aclose()
                await state.engine.aclose()
        nursery.cancel_scope.cancel()  # the signal watcher
    if trace_sink is not None:
        trace_sink.flush()
    _note("stopped")


async def _run_system(system: ActorSystem, scope: trio.CancelScope, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    with scope:
        await system.run(task_status=task_status)


async def _serve_http(
    options: ServeOptions,
    bound: list[tuple[Surface, BoundListener]],
    context: SurfaceContext,
    state: ServerState,
    shutdown: ShutdownSignal,
    handle: ServerHandle,
    print_line: Callable[[str], None],
    task_status: trio.TaskStatus[ServerHandle],
) -> None:
    stop_accepting = trio.Event()
    apps = create_surface_apps([surface for surface, _ in bound], context)
    async with trio.open_nursery() as http_nursery:
        for surface, listener in bound:
            app = apps[surface.name]
            config = _hypercorn_config(options, listener)
            await http_nursery.start(
                partial(hypercorn.trio.serve, app, config, shutdown_trigger=stop_accepting.wait)
            )
            print_line(f"listening {surface.name} {listener.url}")
        state.accepting = True
        print_line("ready")
        task_status.started(handle)
        await handle._requested.wait()
        _note("shutting down")
        state.accepting = False
        shutdown.set()  # streams end cleanly before hypercorn would cancel them
        stop_accepting.set()
    # every hypercorn server has returned: no request is in flight any more


async def _watch_signals(signals: Any, handle: ServerHandle, graceful: trio.CancelScope) -> None:
    async for signal_number in signals:
        if not handle._requested.is_set():
            _note(f"{signal.Signals(signal_number).name} received")
            handle.request_shutdown()
        else:
            _note("second signal: skipping the graceful waits")
            graceful.cancel()


# ---------------------------------------------------------------------------- command line
# The flags themselves are defined once, in troupe/cli.py (``troupe serve``).


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


async def _serve_process(options: ServeOptions) -> None:
    """``serve`` as the ``troupe serve`` process runs it: once ready, the start-up heap is
    frozen out of the garbage collector's walks (``_process``; not done inside ``serve``,
    which tests run many times in one process)."""
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(serve, options))
        freeze_startup_heap()


def serve_main(arguments: Any) -> int:
    """Run ``troupe serve`` with parsed ``arguments`` (``data_dir``, ``config``, ``listen``,
    ``trace``); returns the process exit code (0 after a graceful shutdown)."""
    try:
        options = load_serve_options(arguments)
    except ConfigError as exc:
        _note(str(exc))
        return exit_code_config
    try:
        trio.run(_serve_process, options)
    except (ServeError, StorageError, OSError, BaseExceptionGroup) as exc:
        # Failures of the outside world (ports, disk, files) get one line each on stderr;
        # anything else is our bug and keeps its traceback.
        leaves = _leaves(exc)
        if not all(isinstance(leaf, (ServeError, StorageError, OSError)) for leaf in leaves):
            raise
        for leaf in leaves:
            _note(str(leaf))
        return exit_code_config if any(isinstance(leaf, UnknownSurface) for leaf in leaves) else exit_code_failed
    return exit_code_ok


__all__ = ["ServerHandle", "ServerState", "serve", "serve_main"]
