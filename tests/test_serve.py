"""``troupe serve`` end to end: the real command as a subprocess (stdout interface, admin
endpoints, SIGTERM/SIGINT, restart on the same data directory, refusals), the in-process
``serve`` with a surface plug-in, and the configuration merge rules."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass

import httpx
import pytest
import trio

from troupe.http import protect
from troupe.runtime import Actor, ActorKind, read_trace
from troupe.server import (
    ConfigError,
    ListenAddress,
    ListenerRefused,
    ServeOptions,
    Surface,
    admin_surface,
    load_serve_options,
    serve,
)
from troupe.server._listeners import resolve_listener
from troupe.storage import Migration

startup_seconds_max = 60.0
"""Guards against a hung subprocess; not a timing assertion."""


def clean_environment(**extra: str) -> dict[str, str]:
    environment = {name: value for name, value in os.environ.items() if not name.startswith("TROUPE_")}
    # A served knowledge surface would otherwise announce on every network and claim the
    # user's D-Bus session name (their defaults under `troupe serve`); tests stay local.
    environment.update(TROUPE_KNOWLEDGE_DISCOVERY="off", TROUPE_KNOWLEDGE_DBUS="off")
    environment.update(extra)
    return environment


@dataclass
class Running:
    process: trio.Process
    lines: list[str]
    urls: dict[str, str]
    stderr_path: str

    @property
    def admin(self) -> str:
        return self.urls["admin"]


async def read_lines_until_ready(process: trio.Process) -> list[str]:
    """stdout lines up to and including ``ready`` (or until stdout ends)."""
    buffer = b""
    lines: list[str] = []
    while "ready" not in lines:
        data = await process.stdout.receive_some(4096)
        if not data:
            break
        buffer += data
        *complete, buffer = buffer.split(b"\n")
        lines += [line.decode() for line in complete]
    assert buffer == b"", f"partial line after ready: {buffer!r}"
    return lines


async def start_serve(tmp_path, *arguments: str, environment: dict[str, str] | None = None) -> Running:
    stderr_path = str(tmp_path / f"stderr-{len(os.listdir(tmp_path))}.txt")
    with open(stderr_path, "wb") as stderr:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "troupe", "serve", *arguments],
            stdout=subprocess.PIPE,
            stderr=stderr,
            cwd=str(tmp_path),
            env=environment or clean_environment(),
        )
    with trio.fail_after(startup_seconds_max):
        lines = await read_lines_until_ready(process)
    urls = {}
    for line in lines[:-1]:
        word, surface, url = line.split(" ")
        assert word == "listening"
        urls[surface] = url
    return Running(process, lines, urls, stderr_path)


async def stop(running: Running, signal_number: int) -> int:
    running.process.send_signal(signal_number)
    with trio.fail_after(startup_seconds_max):
        code = await running.process.wait()
        rest = b""
        while data := await running.process.stdout.receive_some(4096):
            rest += data
    assert rest == b"", f"stdout after ready must stay silent: {rest!r}"
    return code


async def run_to_exit(tmp_path, *arguments: str, environment: dict[str, str] | None = None) -> tuple[int, str, str]:
    with trio.fail_after(startup_seconds_max):
        result = await trio.run_process(
            [sys.executable, "-m", "troupe", "serve", *arguments],
            capture_stdout=True, capture_stderr=True, check=False,
            cwd=str(tmp_path), env=environment or clean_environment(),
        )
    return result.returncode, result.stdout.decode(), result.stderr.decode()


# -- the real command ----------------------------------------------------------------------


async def test_serve_answers_on_admin_and_stops_cleanly_then_restarts_on_the_same_data(tmp_path):
    data_dir = tmp_path / "data"
    trace_file = tmp_path / "trace.cbor"
    running = await start_serve(tmp_path, "--data-dir", str(data_dir), "--listen", "admin=127.0.0.1:0",
                                "--listen", "host=127.0.0.1:0", "--listen", "sessions=127.0.0.1:0",
                                "--listen", "character=127.0.0.1:0", "--listen", "knowledge=127.0.0.1:0",
                                "--trace", str(trace_file))
    assert len(running.lines) == 6
    assert running.lines[0].startswith("listening admin http://127.0.0.1:")
    assert running.lines[1].startswith("listening host http://127.0.0.1:")
    assert running.lines[2].startswith("listening sessions http://127.0.0.1:")
    assert running.lines[3].startswith("listening character http://127.0.0.1:")
    assert running.lines[4].startswith("listening knowledge http://127.0.0.1:")
    assert running.lines[5] == "ready"
    port = int(running.admin.rsplit(":", 1)[1])
    assert port != 0

    async with httpx.AsyncClient(base_url=running.admin) as client:
        health = await client.get("/healthz")
        ready = await client.get("/readyz")
        metrics = await client.get("/metrics")
        actors = await client.get("/actors")
        rebound = await client.get("/healthz", headers={"Host": "attacker.example"})
        too_large = await client.post("/healthz", content=b"x" * (1024 * 1024 + 1))
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert ready.status_code == 200
    assert ready.json()["components"] == {"storage": True, "actor_system": True, "accepting": True}
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "# TYPE troupe_storage_commits_total counter" in metrics.text
    assert "troupe_supervisor_restarts_total 0" in metrics.text
    assert actors.status_code == 200 and actors.json()["storage"]["commits"] >= 1
    assert rebound.status_code == 400 and rebound.json()["error"]["code"] == "bad_host"
    assert too_large.status_code == 413 and too_large.json()["error"]["code"] == "payload_too_large"

    assert await stop(running, signal.SIGTERM) == 0
    assert (data_dir / "troupe.db").exists()
    read_trace(trace_file.read_bytes())  # a well-formed (possibly empty) CBOR record stream

    # The same data directory again, this time through a config file, stopped with SIGINT.
    config = tmp_path / "troupe.toml"
    config.write_text('[serve]\ndata_dir = "data"\n\n[serve.listen]\nadmin = "localhost:0"\nhost = "off"\nsessions = "off"\ncharacter = "off"\nknowledge = "off"\n')
    again = await start_serve(tmp_path, "--config", str(config))
    assert again.lines[0].startswith("listening admin http://127.0.0.1:")
    async with httpx.AsyncClient(base_url=again.admin) as client:
        ready = await client.get("/readyz")
        also_ready = await client.get("/readyz", headers={"Host": "localhost"})
    assert ready.status_code == 200 and also_ready.status_code == 200
    assert await stop(again, signal.SIGINT) == 0
    stderr = open(again.stderr_path).read()
    assert "SIGINT received" in stderr and "stopped" in stderr


async def test_a_non_loopback_listener_is_refused_before_anything_is_opened(tmp_path):
    code, stdout, stderr = await run_to_exit(tmp_path, "--data-dir", "data", "--listen", "admin=0.0.0.0:0",
                                             "--listen", "host=off", "--listen", "sessions=off",
                                             "--listen", "character=off", "--listen", "knowledge=off")
    assert code == 1
    assert stdout == ""
    assert "TROUPE_ALLOW_NON_LOOPBACK=1" in stderr
    assert not (tmp_path / "data").exists()


async def test_the_environment_can_allow_a_non_loopback_address():
    address = ListenAddress("0.0.0.0", 0)
    with pytest.raises(ListenerRefused):
        await resolve_listener("admin", address, allow_non_loopback=False)
    entry = await resolve_listener("admin", address, allow_non_loopback=True)
    assert entry[4][0] == "0.0.0.0"
    assert load_serve_options(None, environ={"TROUPE_ALLOW_NON_LOOPBACK": "1"}).allow_non_loopback
    assert not load_serve_options(None, environ={"TROUPE_ALLOW_NON_LOOPBACK": "yes"}).allow_non_loopback


async def test_a_taken_port_fails_the_start_without_touching_the_data_dir(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, stdout, stderr = await run_to_exit(tmp_path, "--data-dir", "data", "--listen", f"admin=127.0.0.1:{port}",
                                                 "--listen", "host=off", "--listen", "sessions=off",
                                             "--listen", "character=off", "--listen", "knowledge=off")
    assert code == 1 and stdout == ""
    assert f"cannot bind 127.0.0.1:{port}" in stderr
    assert not (tmp_path / "data").exists()


async def test_configuration_mistakes_exit_with_code_2(tmp_path):
    code, stdout, stderr = await run_to_exit(tmp_path, "--data-dir", "data", "--listen", "nosuch=127.0.0.1:0")
    assert (code, stdout) == (2, "")
    assert "no surface named nosuch" in stderr
    code, _, stderr = await run_to_exit(tmp_path, "--listen", "admin=127.0.0.1")
    assert code == 2 and "HOST:PORT" in stderr
    (tmp_path / "bad.toml").write_text("[serve]\ndata_dri = 'x'\n")
    code, _, stderr = await run_to_exit(tmp_path, "--config", "bad.toml")
    assert code == 2 and "unknown keys in [serve]: data_dri" in stderr


# -- in process: surface plug-ins, shutdown handle, trace ------------------------------------


@dataclass(frozen=True)
class Hello:
    name: str


class Greeter(Actor):
    async def receive(self, message):
        return f"hello {message.name}"


def greeter_surface() -> Surface:
    from quart import request
    from quart_trio import QuartTrio

    def create_app(context):
        app = QuartTrio("greeter")

        @app.get("/hello")
        async def hello():
            return {"text": await context.system.ref("greeter", "one").ask(Hello(request.args["name"]), timeout=10)}

        @app.get("/table")
        async def table():
            rows = await context.engine.read(lambda connection: connection.execute("SELECT count(*) FROM greetings").get)
            return {"rows": rows}

        app.asgi_app = protect(app.asgi_app)
        return app

    migration = Migration("greeter", 1, "greetings table", "CREATE TABLE greetings (id INTEGER PRIMARY KEY)")
    return Surface(
        "greeter",
        ListenAddress("127.0.0.1", 0),
        create_app,
        actor_kinds=(ActorKind("greeter", lambda context: Greeter(context)),),
        migrations=(migration,),
    )


async def test_serve_mounts_surface_plug_ins_with_their_kinds_and_migrations(tmp_path):
    printed: list[str] = []
    options = ServeOptions(
        data_dir=str(tmp_path / "data"),
        listen={"admin": ListenAddress("127.0.0.1", 0)},
        trace_file=str(tmp_path / "trace.cbor"),
    )
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(lambda task_status: serve(
            options, surfaces=[admin_surface, greeter_surface()], handle_signals=False,
            print_line=printed.append, task_status=task_status,
        ))
        assert printed == [f"listening admin {handle.urls['admin']}", f"listening greeter {handle.urls['greeter']}", "ready"]
        async with httpx.AsyncClient() as client:
            hello = await client.get(handle.urls["greeter"] + "/hello", params={"name": "小天"})
            table = await client.get(handle.urls["greeter"] + "/table")
            actors = await client.get(handle.urls["admin"] + "/actors")
            metrics = await client.get(handle.urls["admin"] + "/metrics")
        assert hello.json() == {"text": "hello 小天"}
        assert table.json() == {"rows": 0}
        assert actors.json()["kinds"]["greeter"]["live"] == 1
        assert 'troupe_actor_turns_total{kind="greeter"} 1' in metrics.text
        handle.request_shutdown()
    records = read_trace((tmp_path / "trace.cbor").read_bytes())
    events = [(record[2], record[3], record[4]) for record in records if record[3] == "greeter"]
    assert events == [("activate", "greeter", "one"), ("turn", "greeter", "one"), ("passivate", "greeter", "one")]


def waiting_surface(arrived: trio.Event) -> Surface:
    """A handler that is in flight when shutdown begins and reports what it saw then."""
    from quart_trio import QuartTrio

    def create_app(context):
        app = QuartTrio("waiting")

        @app.get("/wait")
        async def wait():
            arrived.set()
            await context.shutdown.wait()
            return {"readiness": context.state.readiness()}

        app.asgi_app = protect(app.asgi_app)
        return app

    return Surface("waiting", ListenAddress("127.0.0.1", 0), create_app)


async def test_shutdown_turns_readiness_false_and_lets_requests_in_flight_finish(tmp_path):
    options = ServeOptions(data_dir=str(tmp_path / "data"), listen={"admin": None})
    arrived = trio.Event()
    answers = []
    async with trio.open_nursery() as nursery:
        handle = await nursery.start(lambda task_status: serve(
            options, surfaces=[admin_surface, waiting_surface(arrived)], handle_signals=False,
            print_line=lambda line: None, task_status=task_status,
        ))
        assert set(handle.urls) == {"waiting"}  # admin switched off

        async def request():
            async with httpx.AsyncClient() as client:
                answers.append(await client.get(handle.urls["waiting"] + "/wait"))

        nursery.start_soon(request)
        await arrived.wait()
        handle.request_shutdown()
    assert answers[0].status_code == 200
    assert answers[0].json() == {"readiness": {"storage": True, "actor_system": True, "accepting": False}}


# -- configuration merge rules ----------------------------------------------------------------


@dataclass
class Flags:
    data_dir: str | None = None
    config: str | None = None
    listen: list[str] | None = None
    trace: str | None = None


def test_defaults_when_nothing_is_configured(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    options = load_serve_options(Flags(), environ={})
    assert options.data_dir == "./troupe-data"
    assert dict(options.listen) == {}
    assert options.trace_file is None and not options.allow_non_loopback
    assert admin_surface.listen_default == ListenAddress("127.0.0.1", 8700)


def test_flags_override_environment_override_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "troupe.toml").write_text(
        '[serve]\ndata_dir = "from-file"\ntrace_file = "t.cbor"\nallowed_hosts = ["a.internal"]\n'
        'request_body_bytes_max = 5\n[serve.listen]\nadmin = "127.0.0.1:1111"\nhost = "off"\n'
        "[models]\nanything = 1\n"
    )
    file_only = load_serve_options(Flags(config="etc/troupe.toml"), environ={})
    assert file_only.data_dir == str(tmp_path / "etc" / "from-file")  # relative to the file
    assert file_only.trace_file == str(tmp_path / "etc" / "t.cbor")
    assert dict(file_only.listen) == {"admin": ListenAddress("127.0.0.1", 1111), "host": None}
    assert file_only.allowed_hosts == ("a.internal",)
    assert file_only.request_body_bytes_max == 5

    environ = {
        "TROUPE_CONFIG": "etc/troupe.toml",
        "TROUPE_DATA_DIR": "from-env",
        "TROUPE_LISTEN_ADMIN": "[::1]:2222",
        "TROUPE_TRACE_FILE": "env.cbor",
        "TROUPE_ALLOWED_HOSTS": "b.internal, c.internal",
    }
    from_env = load_serve_options(Flags(), environ=environ)
    assert from_env.data_dir == "from-env"
    assert from_env.listen["admin"] == ListenAddress("::1", 2222)
    assert from_env.listen["host"] is None
    assert from_env.trace_file == "env.cbor"
    assert from_env.allowed_hosts == ("b.internal", "c.internal")

    flags = Flags(data_dir="from-flag", listen=["admin=127.0.0.1:0", "host=localhost:3333"], trace="flag.cbor")
    from_flags = load_serve_options(flags, environ=environ)
    assert from_flags.data_dir == "from-flag"
    assert from_flags.listen["admin"] == ListenAddress("127.0.0.1", 0)
    assert from_flags.listen["host"] == ListenAddress("localhost", 3333)
    assert from_flags.trace_file == "flag.cbor"


def test_a_troupe_toml_in_the_working_directory_is_read_by_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "troupe.toml").write_text('[serve.listen]\nadmin = "127.0.0.1:0"\n')
    options = load_serve_options(Flags(), environ={})
    assert options.listen["admin"] == ListenAddress("127.0.0.1", 0)
    assert options.config_file == str(tmp_path / "troupe.toml")


@pytest.mark.parametrize("text", ["admin", "admin=", "admin=host", "admin=host:port", "admin=:80", "admin=h:70000", "Admin=h:1", "admin=::1:80", "admin=[::1]80"])
def test_bad_listen_flags_are_config_errors(text, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError):
        load_serve_options(Flags(listen=[text]), environ={})


def test_bad_files_are_config_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cases = {
        "missing.toml": None,
        "syntax.toml": "[serve\n",
        "type.toml": "[serve]\ndata_dir = 3\n",
        "listen.toml": "[serve.listen]\nadmin = 8700\n",
        "negative.toml": "[serve]\nrequest_body_bytes_max = -1\n",
    }
    for name, text in cases.items():
        if text is not None:
            (tmp_path / name).write_text(text)
        with pytest.raises(ConfigError):
            load_serve_options(Flags(config=name), environ={})
