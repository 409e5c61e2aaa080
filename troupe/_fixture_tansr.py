"""``troupe fixture tansr DATA_DIR [MODE]``: troupe as the real-serve fixture of the tansr SDK's
integration harness.

Why it exists: the SDK's public integration flow (``integration/session.py`` in tansr-python)
starts a fixture program, reads one readiness line and drives a real server through the
public SDK; this program is that fixture for troupe, so the flow runs against troupe itself.

What it does: opens storage in ``DATA_DIR``, starts the sessions surface on 127.0.0.1 (a free
port) with two end users and their tokens (``fixture-owner`` and ``fixture-other``), the
deterministic fixture model and a synthetic voice, then prints

    TANSR_GO_FIXTURE {"baseURL", "token", "otherToken", "manifestRevision": 7, "mode", ...}

and answers stdin, one line each: ``stop`` (graceful exit, code 0) or a JSON control
``{"command", "requestId", ...}`` answered by ``TANSR_RUST_CONTROL {"requestId", "ok",
"result"}``: ``release-model`` (the blocked model step continues), ``set-auth`` with
``allowed`` false / true (every ``/api`` token refused with 401, then accepted again).

The model reacts to the prompt markers the flow sends: ``GO-BLOCK`` streams one text delta and
then blocks until ``release-model`` (an interrupt cancels it); ``GO-QUESTION`` asks one
question (options ``opt-a`` / ``opt-b``) through AskUser; every answer says
``go-real-serve-answer``.  Questions expire after ``fixture_question_ttl_seconds`` so the flow's
expiry phase sees 410.  It is a test fixture: the secrets are printed, the data dir is the
caller's, nothing here is for production.
"""

from __future__ import annotations

import base64
import json
import re
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any

import trio

readiness_prefix = "TANSR_GO_FIXTURE "
control_prefix = "TANSR_RUST_CONTROL "
owner_end_user = "fixture-owner"
other_end_user = "fixture-other"
answer_marker = "go-real-serve-answer"
block_marker = "GO-BLOCK"
question_marker = "GO-QUESTION"
fixture_question_ttl_seconds = 0.5
"""Shorter than the flow's 0.75 s wait before its expired answer; long enough for its answers."""
fixture_question_grace_seconds = 0.25
"""With no subscriber a question degrades sooner still (the bridge wants grace < ttl)."""

assert 0 < fixture_question_grace_seconds < fixture_question_ttl_seconds
control_line_characters_max = 65_536
image_placeholder = re.compile(r"\[image [^\]]*\]")
transcript_text = "rust synthetic transcript"
synthetic_wav = b"RIFF$\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00@\x1f\x00\x00@\x1f\x00\x00\x01\x00\x08\x00data\x00\x00\x00\x00"

fixture_model_aliases = ("default", "local", "fake-main")
"""The model aliases a create may name here: the harness's configuration flow creates with
``fake-main``."""
fixture_modes = ("session", "session-media-disabled")
"""The harness modes this fixture serves; the others (``execution``, ``archive-offload*``) need
host extensions the sessions contract does not have, so they are refused at start."""
media_disabled_mode = "session-media-disabled"
image_refusal_message = "this deployment's model does not take images (media disabled)"

fixture_question = {"questions": [{"id": "q1", "question": "Which one?", "options": [
    {"id": "opt-a", "label": "A"}, {"id": "opt-b", "label": "B"}]}]}


class FixtureModel:
    """The deterministic fixture model: the embedded agent model plus the harness's markers."""

    def __init__(self, *, images: bool = True) -> None:
        from troupe.models import LocalAgentModel

        self._agent = LocalAgentModel()
        self.images = images
        self.name = "fixture"
        self.capabilities = self._agent.capabilities
        self._release = trio.Event()

    def release(self) -> bool:
        """Let the blocked step (or the next one) continue; True if one was waiting."""
        waiting = self._release.statistics().tasks_waiting > 0
        self._release.set()
        self._release = trio.Event()
        return waiting

    def _scripted(self, request: Any) -> tuple[Any, bool]:
        from troupe.models import ChatMessage, CompletionRequest

        messages = list(request.messages)
        last = max((i for i, m in enumerate(messages) if m.role == "user"), default=None)
        if last is None:
            return request, False
        text = messages[last].content
        first_step = last == len(messages) - 1
        if question_marker in text:
            script = f"/ask {json.dumps(fixture_question)}\n/say {answer_marker}: answered"
        elif text.lstrip().startswith("/"):
            return request, False
        else:
            script = f"/say {answer_marker}: {text[:200]}"
        messages[last] = ChatMessage("user", script)
        return replace(request, messages=tuple(messages)) if isinstance(request, CompletionRequest) else request, \
            block_marker in text and first_step

    def _refuse_images(self, request: Any) -> None:
        """Media disabled: a text-only provider refuses a turn whose new input carries an image
        (the kernel gives the model an image as ``[image MIME]``), so that turn fails, as it
        would; later text turns go on."""
        from troupe.models import ModelRefused

        users = [message for message in request.messages if message.role == "user"]
        if not self.images and users and image_placeholder.search(users[-1].content or ""):
            raise ModelRefused(image_refusal_message)

    async def complete(self, request: Any) -> Any:
        self._refuse_images(request)
        scripted, _ = self._scripted(request)
        return await self._agent.complete(scripted)

    async def stream(self, request: Any) -> AsyncIterator[Any]:
        from troupe.models import CompletionChunk

        self._refuse_images(request)
        scripted, block = self._scripted(request)
        if block:
            yield CompletionChunk(text_delta=f"{answer_marker} (blocked) ")
            await self._release.wait()
        async for chunk in self._agent.stream(scripted):
            yield chunk


class SyntheticVoice:
    """The audio endpoints' provider in the fixture: a fixed transcript, a tiny WAV."""

    async def transcribe(self, body: dict) -> dict:
        await trio.lowlevel.checkpoint()
        return {"text": transcript_text, "language": body.get("language") or "en"}

    async def speak(self, body: dict) -> dict:
        await trio.lowlevel.checkpoint()
        mime = "audio/wav" if body.get("format", "wav") == "wav" else "audio/mpeg"
        return {"audio": {"mime": mime, "data": base64.b64encode(synthetic_wav).decode("ascii")}}


def _emit(prefix: str, document: dict) -> None:
    sys.stdout.write(prefix + json.dumps(document, ensure_ascii=True, separators=(",", ":")) + "\n")
    sys.stdout.flush()


async def run_fixture(data_dir: str, mode: str) -> int:
    import hypercorn.trio
    from hypercorn.config import Config

    from troupe.actors.sessions import (
        SessionSettings,
        end_user_actor_kind,
        session_actor_kind,
        sessions_migrations,
        webhook_migrations,
    )
    from troupe.auth import (
        TokenScope,
        auth_migrations,
        new_token_secret,
        sessions_audience,
        token_create,
    )
    from troupe.http import ShutdownSignal
    from troupe.http.sessions import SessionsAppDependencies, create_sessions_app
    from troupe.runtime import ActorSystem, real_env
    from troupe.storage import Engine

    if mode not in fixture_modes:
        print(f"troupe fixture tansr: mode {mode!r} is not served (modes: {', '.join(fixture_modes)})",
              file=sys.stderr)
        return 2
    media = mode != media_disabled_mode
    env = real_env(data_dir)
    model = FixtureModel(images=media)
    env.model = model
    migrations = list(dict.fromkeys([*auth_migrations, *sessions_migrations, *webhook_migrations]))
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        engine = await Engine.open(env, nursery=nursery, migrations=migrations)
        settings = SessionSettings(question_ttl_seconds=fixture_question_ttl_seconds,
                                   question_grace_seconds=fixture_question_grace_seconds,
                                   known_model_aliases=fixture_model_aliases)
        system = ActorSystem(env, [session_actor_kind(settings), end_user_actor_kind()], storage=engine)
        await nursery.start(system.run)
        secrets = {}
        for end_user in (owner_end_user, other_end_user):
            secret = new_token_secret(env.random)
            now = env.clock.wall()
            name = f"{end_user}-{env.ids.new_id()}"
            await engine.write(lambda connection, name=name, secret=secret, end_user=end_user, now=now: token_create(
                connection, name=name, scope=TokenScope.of_end_user(end_user), secret=secret, created_at=now,
                audience=sessions_audience))
            secrets[end_user] = secret
        shutdown = ShutdownSignal()
        dependencies = SessionsAppDependencies(env=env, engine=engine, system=system, shutdown=shutdown,
                                               readiness=lambda: not shutdown.is_set(),
                                               voice=SyntheticVoice() if media else None)
        app = create_sessions_app(dependencies)
        facade = app.asgi_app
        config = Config()
        config.bind = ["127.0.0.1:0"]
        config.accesslog = None
        config.errorlog = None
        config.graceful_timeout = 1.0
        binds = await nursery.start(lambda task_status: hypercorn.trio.serve(
            app, config, shutdown_trigger=stop.wait, task_status=task_status))
        port = int(binds[0].rsplit(":", 1)[1])
        _emit(readiness_prefix, {
            "baseURL": f"http://127.0.0.1:{port}", "token": secrets[owner_end_user],
            "otherToken": secrets[other_end_user], "manifestRevision": 7, "mode": mode,
            "principals": [owner_end_user, other_end_user], "model": "fixture",
        })
        while not stop.is_set():
            line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
            if not line or line.strip() == "stop":
                break
            _emit(control_prefix, _control(line[:control_line_characters_max], model, facade))
        shutdown.set()
        stop.set()
        await trio.sleep(0.2)
        nursery.cancel_scope.cancel()
    return 0


def _control(line: str, model: FixtureModel, facade: Any) -> dict:
    try:
        command = json.loads(line)
    except ValueError:
        return {"requestId": None, "ok": False, "error": "not JSON"}
    if not isinstance(command, dict):
        return {"requestId": None, "ok": False, "error": "not an object"}
    request_id = command.get("requestId")
    name = command.get("command")
    if name == "release-model":
        return {"requestId": request_id, "ok": True, "result": {"released": model.release()}}
    if name == "set-auth" and isinstance(command.get("allowed"), bool):
        facade.unified.app.tokens_allowed = command["allowed"]
        return {"requestId": request_id, "ok": True, "result": {"allowed": command["allowed"]}}
    return {"requestId": request_id, "ok": False, "error": f"unknown command {name!r}"}


def fixture_main(argv: Sequence[str]) -> int:
    """``troupe fixture tansr DATA_DIR [MODE]`` (MODE defaults to ``session``)."""
    arguments = list(argv)
    if len(arguments) < 2 or arguments[0] != "tansr":
        print("usage: troupe fixture tansr DATA_DIR [MODE]", file=sys.stderr)
        return 2
    mode = arguments[2] if len(arguments) > 2 else "session"
    return trio.run(run_fixture, arguments[1], mode)


__all__ = [
    "FixtureModel",
    "SyntheticVoice",
    "answer_marker",
    "control_prefix",
    "fixture_main",
    "fixture_question_ttl_seconds",
    "readiness_prefix",
    "run_fixture",
]
