"""The ``("session", id)`` actor: one agent session's epoch, event stream, turns and bridges.

What it owns (and nothing else may touch): the store row as last committed, the epoch (an
epoch is open while the session is *live* in this process), the ``EventRing`` of the epoch,
the subscribers of its SSE streams, the running turn (the kernel's ``run_turn`` in a
background task), the ``Bridges`` of that turn, and the turn-end webhook decision.

Why the pieces fit this way:

- **One publisher.**  Every event (the kernel's, the bridges' control events, the actor's own
  ``session.created`` / ``session.ended`` / warnings) goes through ``publish``: synchronous, it
  assigns the next seq, builds the envelope, encodes the frame once, appends it to the ring,
  keeps it for the next commit and offers it to every subscriber.  Being synchronous it is
  atomic with respect to the actor's turns, which is what makes "replay, then register" in
  ``Subscribe`` race-free, and it can be called from the kernel's task and ``finally`` blocks.
- **Turn-granular commit.**  A turn's events, its history messages, the watermark and the
  usage snapshot are written in ONE storage write when the turn ends (``commit_turn``), before
  anything is acknowledged as durable.  A crash mid-turn loses that turn only.
- **Seal only at a clean epoch end.**  While live, commits leave the epoch unsealed: events of
  the next turn are streamed before they are committed, so after a crash the next epoch must
  start above anything a client may have seen (``epoch_start``'s ``now - createdAt`` rule).
  Close, drain and passivation with no running turn flush and seal, so the next epoch starts
  exactly at ``lastSeq + 1``.
- **Dormant reads** (meta, history, list, checkpoints) answer from the store; live-only
  operations (input, events, bridge answers) on a dormant session answer
  ``session_not_found`` (``session_ended`` once closed): the client resumes (L3).
- **Admission.**  Opening an epoch asks ``("end_user", id)`` for a slot (the per-user cap);
  the epoch's end releases it, and so does the next activation after a crash.
- **Webhook.**  At ``turn.completed`` / ``turn.aborted`` with no subscriber the turn-end
  notice is enqueued at once; with subscribers the decision is re-checked after
  ``webhook_recheck_seconds`` (a disconnect racing the terminal frame), once per turn.

A crash of the actor (a bug) discards the epoch: the next message finds the session dormant.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import trio

from troupe.runtime import Actor, ActorContext, ActorKind, TaskEnded

from ._bridges import (
    Answered,
    Bridges,
    permission_ttl_seconds,
    question_ttl_seconds,
    question_unattended_grace_seconds,
)
from ._checkpoints import (
    create_checkpoint,
    delete_checkpoint,
    export_checkpoint,
    fork_from_checkpoint,
    import_checkpoint,
    list_checkpoints,
    load_checkpoint,
    restore_checkpoint,
)
from ._end_users import AdmitSession, Admitted, NoteSessionState, ReleaseSession
from ._frames import event_frame, is_control_type, server_platform_warning
from ._inputs import advance_history_epoch, book_of, input_handlers, settle_receipts
from ._kernel import TurnHandle, TurnOutcome, TurnRequest, run_turn
from ._profiles import ToolTable, resolve_tool_table
from ._prompts import compose_system_prompt
from ._protocol import (
    Accepted,
    AnswerPermission,
    AnswerQuestion,
    AnswerTool,
    ChangeCwd,
    CheckpointExport,
    CheckpointList,
    CloseSession,
    Compact,
    CompactResult,
    CreateCheckpoint,
    CreateOptions,
    CwdChanged,
    DeleteCheckpoint,
    Drain,
    ExportCheckpoint,
    ImageBlock,
    ImportCheckpoint,
    Interrupt,
    ListCheckpoints,
    OpenSession,
    PlatformPromptOptions,
    PostInput,
    ReadHistory,
    ReadMeta,
    RestoreCheckpoint,
    SessionHistory,
    SessionMeta,
    SessionOpened,
    SessionRefused,
    SessionRequest,
    Subscribe,
    Subscribed,
    TextBlock,
    Unsubscribe,
    end_user_kind_name,
    session_kind_name,
)
from ._ring import EventRing, ring_bytes_max_default, ring_events_max_default
from ._store import (
    SessionRow,
    StoreCorrupted,
    StoredEvent,
    UsageSnapshot,
    begin_epoch,
    commit_turn,
    encode_json,
    epoch_start,
    event_kind_control,
    event_kind_kernel,
    insert_session,
    load_session,
    mark_status,
    read_history,
    replace_history,
    session_status_ended,
    session_status_idle,
    session_status_running,
    set_cwd,
    usage_is_stale,
)
from ._subscribers import close_reason_shutdown
from ._webhook_delivery import webhook_deliveries_in
from ._webhook_signing import TurnEndNotice

logger = logging.getLogger("troupe.sessions")

event_version = 1
"""The envelope's ``v``."""

webhook_recheck_seconds = 2.0
"""With a subscriber at a turn's end, the webhook decision is taken again after this long."""

subscriber_sweep_seconds = 5.0
"""While streams are attached, paused connections are checked this often (the subscriber's
own 10 s grace applies); the sweep also keeps the actor from idling out under a live stream."""

queued_inputs_max = 8
"""Prompts posted while a turn runs wait for it, at most this many (then ``turn_running``)."""

turn_abort_wait_seconds = 10.0
"""Close and drain interrupt the running turn and wait this long for it to end as aborted."""

uncommitted_events_max = 50_000
"""Events published since the last commit before the running turn is interrupted."""

unsealed_epoch_margin = 2 * uncommitted_events_max
"""After a crash (unsealed epoch) the next epoch starts at least this far above the watermark:
the events a crashed epoch streamed but never committed are bounded by
``uncommitted_events_max`` plus the few an interrupted turn still publishes, while the
contract's ``now - createdAt`` term alone fails when a turn streams faster than one event per
millisecond (always, under the simulator's clock)."""

admission_timeout_seconds = 10.0
"""How long opening an epoch waits for the end-user actor's admission."""

notified_turns_remembered_max = 256
"""Turn ids whose webhook was decided, remembered to decide once per turn."""

compact_keep_messages = 6
"""A compaction keeps this many newest messages and folds the older ones into one summary."""

compact_summary_chars_max = 4000
"""The folded summary message is cut to this many characters."""

session_resumed_event = "session.resumed"
"""The event that opens a resumed epoch, at its first seq (see ``_resume``)."""
known_model_aliases_default = ("default", "local")
"""The ``model`` aliases a create request may name when the deployment lists none."""

assert webhook_recheck_seconds > 0
assert subscriber_sweep_seconds > 0
assert queued_inputs_max >= 0
assert compact_keep_messages >= 1


class TurnEndNotifier:
    """The webhook port: ``enqueue_turn_end(notice)`` with a ``TurnEndNotice`` (the webhook
    slice's delivery queue implements it).  Declared here as documentation of the shape."""

    async def enqueue_turn_end(self, notice: Any) -> Any:  # pragma: no cover - a port
        raise NotImplementedError


TurnRunner = Callable[[TurnRequest, Any, TurnHandle], Awaitable[TurnOutcome]]


@dataclass(frozen=True)
class SessionSettings:
    """What every session actor of a deployment shares (one per server)."""

    ring_events_max: int = ring_events_max_default
    ring_bytes_max: int = ring_bytes_max_default
    turn_runner: TurnRunner = run_turn
    """The kernel; tests and the simulator may script it."""
    tool_settings: Any = None
    app_capabilities: tuple[str, ...] | None = None
    known_model_aliases: tuple[str, ...] = known_model_aliases_default
    platform_default: str = ""
    """The platform's default application prompt (used when none is configured)."""
    platform_system: str | tuple[str, ...] | None = None
    """The platform's configured application prompt (``None`` = use ``platform_default``)."""
    cwd_policy: Callable[[str], SessionRefused | None] | None = None
    """Accepts or refuses a working directory; ``None`` = no policy, every cwd refused."""
    notifier: Any = None
    """A ``TurnEndNotifier``; ``None`` = no turn-end webhook configured."""
    webhook_recheck_seconds: float = webhook_recheck_seconds
    max_output_tokens: int = 1024
    permission_ttl_seconds: float = permission_ttl_seconds
    """An unanswered permission request is denied after this long (the contract's 120 s)."""
    question_grace_seconds: float = question_unattended_grace_seconds
    """With no subscriber this long, a question degrades to "decide and continue" (60 s)."""
    question_ttl_seconds: float = question_ttl_seconds
    input_durable_ack: bool = False
    """Strict inputs may ask for ``durable`` acknowledgement (``_inputs``); False = refused."""


# -- internal messages -------------------------------------------------------------------------


@dataclass(frozen=True)
class _WebhookRecheck:
    turn_id: str
    status: str
    reason: str | None


@dataclass(frozen=True)
class _SweepSubscribers:
    pass


_turn_task_name = "turn"


@dataclass
class _RunningTurn:
    turn_id: str
    handle: TurnHandle
    done: trio.Event = field(default_factory=trio.Event)
    outcome: TurnOutcome | None = None
    error: BaseException | None = None
    finalized: bool = False


@dataclass
class _Ports:
    """``KernelPorts`` for one session."""

    env: Any
    publish: Any
    bridges: Bridges
    model: Any
    inputs: Any = None
    """The running turn's ``_inputs.TurnInbox`` (strict inputs the kernel takes at its steps)."""


def _milliseconds(wall_seconds: float) -> int:
    return int(wall_seconds * 1000)


def _compose(settings: SessionSettings, platform: PlatformPromptOptions) -> tuple[str, dict[str, Any]]:
    """The system prompt and its summary (``_prompts.compose_system_prompt``): the request's
    ``platform.system`` are the SDK segments, the deployment holds the platform segment."""
    return compose_system_prompt(
        settings.platform_default,
        settings.platform_system,
        platform.system_append,
        platform.strategy,
        sdk_segments=platform.system,
    )


class SessionActor(Actor):
    def __init__(self, context: ActorContext, settings: SessionSettings) -> None:
        super().__init__(context)
        self.settings = settings
        self.session_id = context.key
        self.row: SessionRow | None = None
        self.corrupted: str | None = None
        self.live = False
        self.closing = False
        self.ring: EventRing | None = None
        self.next_seq = 1
        self.uncommitted: list[StoredEvent] = []
        self.subscribers: dict[Any, None] = {}
        self.history: list[dict[str, Any]] = []
        self.tool_table: ToolTable | None = None
        self.turn: _RunningTurn | None = None
        self.queued_inputs: deque[PostInput] = deque()
        self.usage_lag: int | None = None
        self.prefixes_seen: set[str] = set()
        self.notified_turns: OrderedDict[str, None] = OrderedDict()
        self.bridges = Bridges.for_env(
            context.env, publish=self.publish, has_subscribers=lambda: bool(self.subscribers),
            permission_ttl=settings.permission_ttl_seconds, question_grace=settings.question_grace_seconds,
            question_ttl=settings.question_ttl_seconds,
        )

    # -- life cycle ------------------------------------------------------------------------

    async def on_activate(self) -> None:
        storage = self.context.storage
        if storage is None:
            return
        try:
            self.row = await storage.read(lambda connection: load_session(connection, self.session_id))
        except StoreCorrupted as error:
            self.corrupted = error.reason
            return
        if self.row is not None:
            # A previous instance may have crashed while holding the end user's slot.
            self._end_user_ref(self.row.end_user_id).tell(ReleaseSession(self.session_id))

    async def on_passivate(self) -> None:
        """Passivation with the epoch open is a graceful shutdown (``ActorSystem.drain``) or
        an eviction: the running turn ends ``turn.aborted`` and is committed, streams are
        closed and the epoch is sealed, exactly as ``Drain`` does.  A crash never gets here:
        then the turn is lost and the epoch stays unsealed."""
        if self.live and self.row is not None:
            await self._drain(Drain())

    # -- dispatch --------------------------------------------------------------------------

    async def receive(self, message: Any) -> Any:
        if isinstance(message, TaskEnded):
            return await self._on_task_ended(message)
        if isinstance(message, _WebhookRecheck):
            return await self._on_webhook_recheck(message)
        if isinstance(message, _SweepSubscribers):
            return self._sweep_subscribers()
        if isinstance(message, Drain):
            return await self._drain(message)
        if not isinstance(message, SessionRequest):
            raise TypeError(f"session actor cannot handle {type(message).__name__}")
        if self.corrupted is not None:
            return SessionRefused("store_corrupted", "会话存储损坏", {"reason": self.corrupted})
        self._note_prefix(message.via)
        try:
            if isinstance(message, OpenSession):
                return await self._open(message)
            refusal = self._check_owner(message)
            if refusal is not None:
                return refusal
            handler = self._handlers.get(type(message))
            if handler is None:
                raise TypeError(f"session actor cannot handle {type(message).__name__}")
            return await handler(self, message)
        except StoreCorrupted as error:
            self.corrupted = error.reason
            return SessionRefused("store_corrupted", "会话存储损坏", {"reason": error.reason})

    def _check_owner(self, message: SessionRequest) -> SessionRefused | None:
        if self.row is None:
            return SessionRefused("session_not_found", "会话不存在", {"sessionId": self.session_id})
        if self.row.end_user_id != message.end_user_id:
            return SessionRefused("forbidden", "会话不属于该终端用户")
        return None

    def _require_live(self) -> SessionRefused | None:
        assert self.row is not None
        if self.live and not self.closing:
            return None
        if self.closing or self.row.status == session_status_ended:
            return SessionRefused("session_ended", "会话已结束", {"sessionId": self.session_id})
        return SessionRefused(
            "session_not_found", "会话不在内存中，请先 resume", {"sessionId": self.session_id, "live": False}
        )

    def _note_prefix(self, via: str) -> None:
        if via in self.prefixes_seen:
            return
        self.prefixes_seen.add(via)
        if len(self.prefixes_seen) == 2:
            self.context.trace("api.legacy_prefix_mixed", session=self.session_id)
            logger.warning("api.legacy_prefix_mixed session=%s", self.session_id)

    # -- the publisher ---------------------------------------------------------------------

    def publish(self, type: str, payload: dict[str, Any], turn_id: str | None = None) -> int:
        """Assign the next seq, frame the event once, keep it in the ring and for the next
        commit, and offer it to every subscriber.  Synchronous by design (see module doc)."""
        assert self.live and self.ring is not None, "publish outside an epoch"
        seq = self.next_seq
        control = is_control_type(type)
        event: dict[str, Any] = {"type": type, "sessionId": self.session_id}
        if turn_id is not None:
            event["turnId"] = turn_id
        event.update(
            seq=seq,
            ts=_milliseconds(self.context.env.clock.wall()),
            v=event_version,
            source="server" if control else "kernel",
        )
        for key, value in payload.items():
            # Control payloads carry their own ``ts`` (the bridges' wall clock): it wins.
            assert key == "ts" or key not in event, f"payload key {key!r} would overwrite the envelope"
            event[key] = value
        frame = event_frame(event)
        self.next_seq = seq + 1
        self.ring.append(seq, type, frame)
        self.uncommitted.append(
            StoredEvent(seq=seq, kind=event_kind_control if control else event_kind_kernel, data=encode_json(event))
        )
        for subscriber in list(self.subscribers):
            if not subscriber.offer(frame, type):
                self.subscribers.pop(subscriber, None)
        if len(self.uncommitted) == uncommitted_events_max and self.turn is not None:
            # A turn that streams this much without ending is cut: the crash margin of an
            # unsealed epoch (``unsealed_epoch_margin``) must stay above what was streamed.
            self.turn.handle.interrupt("events_limit")
        return seq

    @property
    def published_seq(self) -> int:
        """The newest seq published in this epoch (the live watermark)."""
        return self.next_seq - 1

    # -- storage helpers -------------------------------------------------------------------

    def _now_ms(self) -> int:
        return _milliseconds(self.context.env.clock.wall())

    async def _commit(
        self,
        *,
        messages: Sequence[Mapping[str, Any]],
        usage: UsageSnapshot | None,
        sealed: bool,
        status: str,
        also: Callable[[Any], None] | None = None,
    ) -> None:
        """One write: the events published since the last commit, ``messages``, the watermark,
        the seal flag, the status and the usage snapshot (and ``also(connection)``, e.g. the
        turn's input receipts, in the same transaction)."""
        assert self.row is not None
        events = tuple(self.uncommitted)
        last_seq = max(self.row.last_seq, events[-1].seq if events else self.row.last_seq)
        if self.live:
            # The watermark covers the epoch's start even when nothing was published in it: an
            # epoch opened above a crashed one (the unsealed margin) and sealed empty must not
            # let the next epoch start back at the old watermark, below seqs clients saw
            # (found by the simulator's sessions workload, seed 1).
            last_seq = max(last_seq, self.published_seq)
        now_ms = self._now_ms()
        session_id = self.session_id

        def write(connection: Any) -> SessionRow:
            row = commit_turn(
                connection, session_id, events=events, messages=messages, last_seq=last_seq,
                sealed=sealed, status=status, usage=usage, last_activity_at_ms=now_ms,
            )
            if also is not None:
                also(connection)
            return row

        row = await self.context.storage.write(write)
        del self.uncommitted[: len(events)]
        self.row = row

    def _end_user_ref(self, end_user_id: str) -> Any:
        return self.context.ref(end_user_kind_name, end_user_id)

    async def _admit(self, end_user_id: str) -> SessionRefused | None:
        reply = await self._end_user_ref(end_user_id).ask(
            AdmitSession(self.session_id), timeout=admission_timeout_seconds
        )
        if isinstance(reply, Admitted):
            return None
        assert isinstance(reply, SessionRefused)
        return reply

    def _note_state(self) -> None:
        if self.row is None or not self.live:
            return
        self._end_user_ref(self.row.end_user_id).tell(
            NoteSessionState(self.session_id, self._status(), self.published_seq, self.row.last_activity_at_ms)
        )

    def _status(self) -> str:
        assert self.row is not None
        if self.live and self.turn is not None and not self.turn.finalized:
            return session_status_running
        if self.row.status == session_status_running:
            return session_status_idle  # a row a crash left mid-turn is not running
        return self.row.status

    # -- opening an epoch ------------------------------------------------------------------

    async def _open(self, message: OpenSession) -> Any:
        if self.context.storage is None:
            return SessionRefused("resume_unavailable", "服务端未接 store")
        if message.mode == "create":
            return await self._create(message)
        if message.mode == "resume":
            return await self._resume(message)
        return await self._fork(message)

    def _assemble(self, options: CreateOptions) -> ToolTable | SessionRefused:
        return resolve_tool_table(
            profile_name=options.capabilities_profile,
            tools=options.tools,
            client_tools=options.client_tools,
            app_capabilities=self.settings.app_capabilities,
        )

    def _validate_create(self, options: CreateOptions) -> SessionRefused | None:
        if options.model is not None and options.model not in self.settings.known_model_aliases:
            return SessionRefused("create_failed", f"未知的模型：{options.model}", {"model": options.model})
        if options.cwd is not None:
            if self.settings.cwd_policy is None:
                return SessionRefused("cwd_not_allowed", "宿主未配置 cwdPolicy")
            return self.settings.cwd_policy(options.cwd)
        return None

    async def _create(self, message: OpenSession) -> Any:
        if self.row is not None:
            return SessionRefused("create_failed", "会话 id 已被占用")
        options = message.options
        refusal = self._validate_create(options)
        if refusal is not None:
            return refusal
        stored = options
        table = self._assemble(stored)
        if isinstance(table, SessionRefused):
            return table
        refusal = await self._admit(message.end_user_id)
        if refusal is not None:
            return refusal
        now_ms = self._now_ms()
        row = SessionRow(
            session_id=self.session_id, end_user_id=message.end_user_id, created_at_ms=now_ms,
            last_activity_at_ms=now_ms, options=stored, seq_sealed=False, epoch_start_seq=1,
        )
        try:
            await self.context.storage.write(lambda connection: insert_session(connection, row))
        except BaseException:
            self._end_user_ref(message.end_user_id).tell(ReleaseSession(self.session_id))
            raise
        self.row = row
        self._start_epoch(1, table, history=[])
        self.publish("session.created", {"endUserId": message.end_user_id})
        await self._commit(messages=(), usage=None, sealed=False, status=session_status_idle)
        if message.prompt is not None:
            self._start_turn(PostInput(end_user_id=message.end_user_id, prompt=message.prompt))
        self._note_state()
        return SessionOpened(self.session_id, resumed=False, last_seq=0, created=True)

    async def _resume(self, message: OpenSession) -> Any:
        refusal = self._check_owner(message)
        if refusal is not None:
            return refusal
        if self.live and not self.closing:
            # Attach: the session is live here; nothing is reloaded.
            if message.prompt is not None:
                self._post(PostInput(end_user_id=message.end_user_id, prompt=message.prompt))
            return SessionOpened(self.session_id, resumed=False, last_seq=self.published_seq, created=False)
        if self.closing:
            return SessionRefused("turn_running", "会话正在关闭，稍后重试", retry_after_seconds=1.0)
        row = self.row
        assert row is not None
        if row.options.cwd is not None and self.settings.cwd_policy is not None:
            refusal = self.settings.cwd_policy(row.options.cwd)
            if refusal is not None:
                return SessionRefused("cwd_unavailable", "会话工作目录已不可用", {"cwd": row.options.cwd})
        table = self._assemble(row.options)
        if isinstance(table, SessionRefused):
            return SessionRefused("create_failed", table.message, table.detail)
        refusal = await self._admit(row.end_user_id)
        if refusal is not None:
            return refusal
        session_id = self.session_id
        start = epoch_start(row, self._now_ms())
        if not row.seq_sealed:
            # Measured from the crashed epoch's own start too: an epoch that crashed before its
            # first commit streamed seqs above its start, not above the (older) watermark, so
            # two crashed epochs in a row must not start at the same seq (simulator, seed 1).
            start = max(start, max(row.last_seq, row.epoch_start_seq - 1) + 1 + unsealed_epoch_margin)

        def reopen(connection: Any) -> tuple[SessionRow, list[dict[str, Any]]]:
            begin_epoch(connection, session_id, start)
            if row.status != session_status_idle:
                mark_status(connection, session_id, session_status_idle)
            page = read_history(connection, session_id)
            fresh = load_session(connection, session_id)
            assert fresh is not None
            return fresh, list(page.messages)

        try:
            fresh, history = await self.context.storage.write(reopen)
        except BaseException:
            self._end_user_ref(row.end_user_id).tell(ReleaseSession(self.session_id))
            raise
        self.row = fresh
        self.usage_lag = usage_is_stale(fresh)
        self._start_epoch(start, table, history=history)
        # The new epoch opens with one committed event at its first seq, and the 201's lastSeq
        # is that seq (the contract's "新纪元起点水位"): a client holding the old watermark
        # reads it at once, without a gap, and its watermark moves past the old epoch's
        # (the tansr SDK's restart flow checks both).
        self.publish(session_resumed_event, {"endUserId": row.end_user_id, "previousLastSeq": row.last_seq})
        await self._commit(messages=(), usage=None, sealed=False, status=session_status_idle)
        if message.prompt is not None:
            self._start_turn(PostInput(end_user_id=message.end_user_id, prompt=message.prompt))
        self._note_state()
        return SessionOpened(self.session_id, resumed=True, last_seq=start, created=True)

    async def _fork(self, message: OpenSession) -> Any:
        if self.row is not None:
            return SessionRefused("create_failed", "会话 id 已被占用")
        source_id = message.fork_source_session_id
        checkpoint_id = message.fork_checkpoint_id or ""
        assert source_id is not None
        source = await self.context.storage.read(lambda connection: load_session(connection, source_id))
        if source is None:
            return SessionRefused("session_not_found", "源会话不存在", {"sessionId": source_id})
        if source.end_user_id != message.end_user_id:
            return SessionRefused("forbidden", "源会话不属于该终端用户")
        found = await self.context.storage.read(
            lambda connection: load_checkpoint(connection, source_id, checkpoint_id)
        )
        if found is None:
            return SessionRefused("checkpoint_not_found", "快照不存在", {"checkpointId": checkpoint_id})
        table = self._assemble(source.options)
        if isinstance(table, SessionRefused):
            return SessionRefused("create_failed", table.message, table.detail)
        refusal = await self._admit(message.end_user_id)
        if refusal is not None:
            return refusal
        now_ms = self._now_ms()
        created = {
            "type": "session.created", "sessionId": self.session_id, "seq": 1, "ts": now_ms,
            "v": event_version, "source": "kernel", "endUserId": message.end_user_id,
            "forkedFrom": {"sessionId": source_id, "checkpointId": checkpoint_id},
        }
        new_row = SessionRow(
            session_id=self.session_id, end_user_id=message.end_user_id, created_at_ms=now_ms,
            last_activity_at_ms=now_ms, options=source.options,
        )
        session_id = self.session_id

        def fork(connection: Any) -> tuple[SessionRow, list[dict[str, Any]]] | None:
            forked = fork_from_checkpoint(
                connection, source_id, checkpoint_id, new_row, events=(StoredEvent.of(created),)
            )
            if forked is None:
                return None
            begin_epoch(connection, session_id, forked.last_seq + 1)
            page = read_history(connection, session_id)
            fresh = load_session(connection, session_id)
            assert fresh is not None
            return fresh, list(page.messages)

        try:
            result = await self.context.storage.write(fork)
        except BaseException:
            self._end_user_ref(message.end_user_id).tell(ReleaseSession(self.session_id))
            raise
        if result is None:
            self._end_user_ref(message.end_user_id).tell(ReleaseSession(self.session_id))
            return SessionRefused("checkpoint_not_found", "快照不存在", {"checkpointId": checkpoint_id})
        self.row, history = result
        self._start_epoch(self.row.last_seq + 1, table, history=history)
        if message.prompt is not None:
            self._start_turn(PostInput(end_user_id=message.end_user_id, prompt=message.prompt))
        self._note_state()
        return SessionOpened(self.session_id, resumed=False, last_seq=self.row.last_seq, created=True)

    def _start_epoch(self, start_seq: int, table: ToolTable, *, history: list[dict[str, Any]]) -> None:
        self.ring = EventRing(
            self.session_id,
            epoch_start_seq=start_seq,
            events_max=self.settings.ring_events_max,
            bytes_max=self.settings.ring_bytes_max,
        )
        self.next_seq = start_seq
        self.uncommitted.clear()
        self.tool_table = table
        self.history = history
        self.live = True
        self.closing = False
        self.context.trace("session_epoch", session=self.session_id, start=start_seq)

    def _end_epoch(self) -> None:
        """The epoch is over in memory (its store side is already written)."""
        if self.row is not None:
            self._end_user_ref(self.row.end_user_id).tell(ReleaseSession(self.session_id))
        for subscriber in list(self.subscribers):
            subscriber.close(close_reason_shutdown)
        self.subscribers.clear()
        self.context.cancel_timer("subscribers")
        self.live = False
        self.closing = False
        self.ring = None
        self.queued_inputs.clear()
        self.usage_lag = None

    # -- input and turns -------------------------------------------------------------------

    async def _post_input(self, message: PostInput) -> Any:
        refusal = self._require_live()
        if refusal is not None:
            return refusal
        return self._post(message)

    def _post(self, message: PostInput) -> Any:
        if self.turn is not None and not self.turn.finalized:
            if message.blocks is not None:
                return SessionRefused("midturn_blocks_rejected", "运行中不接受 blocks 输入")
            if len(self.queued_inputs) >= queued_inputs_max:
                return SessionRefused("turn_running", "本轮进行中，排队输入已满", retry_after_seconds=1.0)
            self.queued_inputs.append(message)
            return Accepted(self.session_id)
        self._start_turn(message)
        return Accepted(self.session_id)

    def _start_turn(self, message: PostInput) -> None:
        assert self.row is not None and self.live
        env = self.context.env
        turn_id = env.ids.new_id("t_")
        options = self.row.options
        system_prompt, _ = _compose(self.settings, options.platform)
        blocks: tuple[dict[str, Any], ...] = ()
        if message.blocks is not None:
            blocks = tuple(_block_json(block) for block in message.blocks)
        request_fields: dict[str, Any] = dict(
            session_id=self.session_id,
            turn_id=turn_id,
            prompt=message.prompt,
            blocks=blocks,
            history=tuple(self.history),
            tools=self.tool_table,
            system_prompt=system_prompt,
            model_name=options.model,
            thinking_budget=options.thinking_budget,
            max_output_tokens=self.settings.max_output_tokens,
            tool_settings=self.settings.tool_settings,
        )
        if options.max_turns is not None:
            request_fields["max_turns"] = options.max_turns
        request = TurnRequest(**request_fields)
        running = _RunningTurn(turn_id, TurnHandle())
        self.turn = running
        ports = _Ports(env=env, publish=self.publish, bridges=self.bridges, model=env.model,
                       inputs=book_of(self).open_turn(turn_id))
        runner = self.settings.turn_runner

        async def run() -> None:
            try:
                running.outcome = await runner(request, ports, running.handle)
            except Exception as error:
                running.error = error
            finally:
                running.done.set()

        self.context.start_task(_turn_task_name, run)
        self._note_state()

    async def _on_task_ended(self, message: TaskEnded) -> None:
        if message.name != _turn_task_name or self.turn is None or self.turn.finalized:
            return
        await self._finalize_turn(self.turn)
        if self.closing:
            await self._close_epoch(ended=True)
            return
        if self.queued_inputs and self.live:
            self._start_turn(self.queued_inputs.popleft())

    async def _finalize_turn(self, running: _RunningTurn) -> None:
        """Commit the turn's events, messages, watermark and usage in one write."""
        running.finalized = True
        outcome = running.outcome
        cut_off = getattr(running.handle, "cut_off", None)
        if outcome is None and running.error is None and cut_off is not None:
            # The runtime cancelled the turn's task under a passivation (eviction, drain):
            # it ends aborted with what it did, like an interrupted turn, not as an error.
            outcome = cut_off(running.handle.reason or "server_draining")
        self.bridges.cancel_all("turn_ended", turn_id=running.turn_id)
        if outcome is None:
            # The kernel failed (a bug) or was cut off: say so on the stream and keep its events.
            error = running.error
            self.publish(
                "turn.error",
                {"code": "internal_error", "message": type(error).__name__ if error else "turn ended",
                 "recoverable": False},
                running.turn_id,
            )
            messages: tuple[dict[str, Any], ...] = ()
        else:
            messages = outcome.messages
        usage = self._usage_after(outcome, len(messages))
        book = book_of(self)
        end_reason = outcome.reason if outcome is not None and outcome.reason else "internal_error"
        settled = book.settlement(running.turn_id, messages, end_reason)
        session_id = self.session_id
        await self._commit(
            messages=messages, usage=usage, sealed=False, status=session_status_idle,
            # The turn's input receipts settle in the turn's own write (unloaded: none exist).
            also=(lambda connection: settle_receipts(connection, session_id, running.turn_id, settled))
            if book.loaded else None,
        )
        book.settled(running.turn_id, settled)
        for receipt in settled:
            self.context.trace(f"session_input_{receipt.state}", session=session_id, input=receipt.input_id,
                               turn=running.turn_id, reason=receipt.reason or "")
        self.history.extend(dict(message) for message in messages)
        self.turn = None
        self._note_state()
        # The webhook's status is completed | aborted only; a turn that failed ended the
        # turn all the same, so it is reported as aborted with its error code as the reason
        # (``internal_error`` when the kernel itself gave no outcome), as the contract lists.
        if outcome is not None and outcome.status in ("completed", "aborted"):
            await self._decide_webhook(running.turn_id, outcome.status, outcome.reason)
        else:
            reason = outcome.reason if outcome is not None and outcome.reason else "internal_error"
            await self._decide_webhook(running.turn_id, "aborted", reason)

    def _usage_after(self, outcome: TurnOutcome | None, new_messages: int) -> UsageSnapshot:
        assert self.row is not None
        previous = self.row.usage or UsageSnapshot()
        input_tokens = previous.input_tokens
        output_tokens = previous.output_tokens
        if outcome is not None:
            input_tokens += outcome.usage.prompt_tokens
            output_tokens += outcome.usage.completion_tokens
        return replace(
            previous, input_tokens=input_tokens, output_tokens=output_tokens,
            as_of_message_count=self.row.message_count + new_messages,
        )

    async def _abort_running_turn(self, reason: str) -> None:
        """Interrupt the running turn and wait (bounded) for it to end, then commit it."""
        running = self.turn
        if running is None or running.finalized:
            return
        running.handle.interrupt(reason)
        with trio.move_on_after(turn_abort_wait_seconds):
            await running.done.wait()
        if not running.done.is_set():
            self.context.cancel_task(_turn_task_name)
        await self._finalize_turn(running)

    async def _interrupt(self, message: Interrupt) -> Any:
        refusal = self._require_live()
        if refusal is not None:
            return refusal
        self.queued_inputs.clear()
        if self.turn is not None and not self.turn.finalized:
            self.turn.handle.interrupt("aborted_by_user")
        return Accepted(self.session_id)

    async def _close(self, message: CloseSession) -> Any:
        if not self.live:
            # Closing a dormant session only marks it ended (idempotent).
            assert self.row is not None
            if self.row.status != session_status_ended:
                session_id = self.session_id
                await self.context.storage.write(
                    lambda connection: mark_status(connection, session_id, session_status_ended)
                )
                self.row = replace(self.row, status=session_status_ended)
            return Accepted(self.session_id)
        if self.closing:
            return Accepted(self.session_id)
        self.queued_inputs.clear()
        await self._abort_running_turn("aborted_by_close")
        await self._close_epoch(ended=True)
        return Accepted(self.session_id)

    async def _close_epoch(self, *, ended: bool) -> None:
        """Flush, seal and leave the epoch; ``ended`` publishes ``session.ended`` first."""
        if ended:
            self.publish("session.ended", {"reason": "closed"})
        status = session_status_ended if ended else session_status_idle
        await self._commit(messages=(), usage=None, sealed=True, status=status)
        self._end_epoch()

    async def _drain(self, message: Drain) -> Any:
        """Shutdown: in-flight turns end as aborted and are committed, streams are closed
        (the HTTP layer writes the long ``retry:`` frame), and the epoch is sealed."""
        if not self.live or self.row is None:
            return Accepted(self.session_id)
        await self._abort_running_turn("server_draining")
        await self._close_epoch(ended=False)
        return Accepted(self.session_id)

    # -- streams ---------------------------------------------------------------------------

    async def _subscribe(self, message: Subscribe) -> Any:
        refusal = self._require_live()
        if refusal is not None:
            return refusal
        assert self.ring is not None
        subscriber = message.subscriber
        if self.usage_lag is not None:
            # The first connection after a resume learns that the usage snapshot lagged the
            # history (a crash between a turn's end and its usage): an advisory, in the ring.
            lag = self.usage_lag
            self.usage_lag = None
            self.publish(
                server_platform_warning,
                {"code": "usage_snapshot_stale", "message": f"用量快照落后于历史 {lag} 条消息",
                 "messages": lag},
            )
        exclude = message.exclude or tuple(getattr(subscriber, "exclude_prefixes", ()))
        replay = self.ring.replay(message.last_event_id, exclude)
        subscriber.start(replay.all_frames())
        self.subscribers[subscriber] = None
        if len(self.subscribers) == 1:
            self.context.start_timer("subscribers", subscriber_sweep_seconds, _SweepSubscribers())
        return Subscribed(
            self.session_id, last_seq=self.published_seq, replayed_frames=len(replay.frames),
            gap=replay.gap is not None,
        )

    async def _unsubscribe(self, message: Unsubscribe) -> Any:
        self.subscribers.pop(message.subscriber, None)
        return Accepted(self.session_id)

    def _sweep_subscribers(self) -> None:
        for subscriber in list(self.subscribers):
            if not subscriber.check_pause():
                self.subscribers.pop(subscriber, None)
        if self.subscribers:
            self.context.start_timer("subscribers", subscriber_sweep_seconds, _SweepSubscribers())

    # -- reads -----------------------------------------------------------------------------

    async def _read_meta(self, message: ReadMeta) -> Any:
        row = self.row
        assert row is not None
        application_prompt = None
        if message.include_application_prompt:
            _, application_prompt = _compose(self.settings, row.options.platform)
        return SessionMeta(
            session_id=self.session_id,
            end_user_id=row.end_user_id,
            status=self._status(),  # type: ignore[arg-type]
            live=self.live,
            last_seq=self.published_seq if self.live else row.last_seq,
            created_at_ms=row.created_at_ms,
            last_activity_at_ms=row.last_activity_at_ms,
            title=row.title,
            application_prompt=application_prompt,
        )

    async def _read_history(self, message: ReadHistory) -> Any:
        session_id = self.session_id
        try:
            page = await self.context.storage.read(
                lambda connection: read_history(connection, session_id, message.offset, message.limit)
            )
        except ValueError as error:
            return SessionRefused("validation_failed", str(error))
        return SessionHistory(
            session_id=session_id, last_seq=page.last_seq, messages=page.messages,
            total=page.total, offset=page.offset, next_offset=page.next_offset,
        )

    # -- bridges ---------------------------------------------------------------------------

    def _bridge_outcome(self, outcome: Any) -> Any:
        if isinstance(outcome, Answered):
            return Accepted(self.session_id)
        return outcome

    def _bridge_refusal(self) -> SessionRefused | None:
        if self.live:
            return None
        return SessionRefused("request_not_found", "会话不在内存中，没有待答请求")

    async def _answer_tool(self, message: AnswerTool) -> Any:
        refusal = self._bridge_refusal()
        if refusal is not None:
            return refusal
        return self._bridge_outcome(self.bridges.answer_tool(message.call_id, message.result, is_error=message.is_error))

    async def _answer_permission(self, message: AnswerPermission) -> Any:
        refusal = self._bridge_refusal()
        if refusal is not None:
            return refusal
        return self._bridge_outcome(
            self.bridges.answer_permission(message.request_id, message.digest, message.verdict)
        )

    async def _answer_question(self, message: AnswerQuestion) -> Any:
        refusal = self._bridge_refusal()
        if refusal is not None:
            return refusal
        return self._bridge_outcome(self.bridges.answer_question(message.request_id, message.answers))

    # -- idle-only operations ----------------------------------------------------------------

    def _refuse_if_running(self) -> SessionRefused | None:
        if self.turn is not None and not self.turn.finalized:
            return SessionRefused("turn_running", "本轮进行中，空闲后重试", retry_after_seconds=1.0)
        return None

    async def _compact(self, message: Compact) -> Any:
        refusal = self._require_live() or self._refuse_if_running()
        if refusal is not None:
            return refusal
        assert self.row is not None
        history = list(self.history)
        if len(history) <= compact_keep_messages:
            return CompactResult({"status": "skipped", "reason": "too_short", "messages": len(history)})
        folded, kept = history[:-compact_keep_messages], history[-compact_keep_messages:]
        summary = {"role": "user", "content": _summary_text(folded), "compacted": len(folded)}
        texts = [encode_json(summary), *(encode_json(message) for message in kept)]
        session_id = self.session_id
        before = await self.context.storage.write(lambda connection: replace_history(connection, session_id, texts))
        self.history = [summary, *kept]
        self.row = replace(self.row, message_count=len(texts))
        return CompactResult({"status": "compacted", "fromMessages": before, "toMessages": len(texts)})

    async def _change_cwd(self, message: ChangeCwd) -> Any:
        refusal = self._refuse_if_running()
        if refusal is not None:
            return refusal
        if self.settings.cwd_policy is None:
            return SessionRefused("cwd_not_allowed", "宿主未配置 cwdPolicy")
        refusal = self.settings.cwd_policy(message.cwd)
        if refusal is not None:
            return refusal
        session_id = self.session_id
        previous = await self.context.storage.write(lambda connection: set_cwd(connection, session_id, message.cwd))
        assert self.row is not None
        self.row = replace(self.row, options=replace(self.row.options, cwd=message.cwd))
        return CwdChanged(message.cwd, previous)

    # -- checkpoints -----------------------------------------------------------------------

    async def _list_checkpoints(self, message: ListCheckpoints) -> Any:
        session_id = self.session_id
        found = await self.context.storage.read(lambda connection: list_checkpoints(connection, session_id))
        return CheckpointList(tuple(found))

    async def _create_checkpoint(self, message: CreateCheckpoint) -> Any:
        session_id = self.session_id
        checkpoint_id = self.context.env.ids.new_id("cp_")
        now_ms = self._now_ms()
        try:
            return await self.context.storage.write(
                lambda connection: create_checkpoint(
                    connection, session_id, checkpoint_id=checkpoint_id, created_at_ms=now_ms, name=message.name
                )
            )
        except ValueError as error:
            return SessionRefused("validation_failed", str(error))

    async def _restore_checkpoint(self, message: RestoreCheckpoint) -> Any:
        refusal = self._refuse_if_running()
        if refusal is not None:
            return refusal
        session_id = self.session_id

        def restore(connection: Any) -> Any:
            result = restore_checkpoint(connection, session_id, message.checkpoint_id)
            if result is None:
                return None
            page = read_history(connection, session_id)
            generation = advance_history_epoch(connection, session_id)
            return result, load_session(connection, session_id), list(page.messages), generation

        found = await self.context.storage.write(restore)
        if found is None:
            return SessionRefused("checkpoint_not_found", "快照不存在", {"checkpointId": message.checkpoint_id})
        result, self.row, history, generation = found
        book_of(self).restored(generation)
        if self.live:
            self.history = history
        return result

    async def _delete_checkpoint(self, message: DeleteCheckpoint) -> Any:
        session_id = self.session_id
        deleted = await self.context.storage.write(
            lambda connection: delete_checkpoint(connection, session_id, message.checkpoint_id)
        )
        if not deleted:
            return SessionRefused("checkpoint_not_found", "快照不存在", {"checkpointId": message.checkpoint_id})
        return Accepted(self.session_id)

    async def _export_checkpoint(self, message: ExportCheckpoint) -> Any:
        session_id = self.session_id
        data = await self.context.storage.read(
            lambda connection: export_checkpoint(connection, session_id, message.checkpoint_id)
        )
        if data is None:
            return SessionRefused("checkpoint_not_found", "快照不存在", {"checkpointId": message.checkpoint_id})
        return CheckpointExport(message.checkpoint_id, data)

    async def _import_checkpoint(self, message: ImportCheckpoint) -> Any:
        session_id = self.session_id
        checkpoint_id = self.context.env.ids.new_id("cp_")
        now_ms = self._now_ms()
        result = await self.context.storage.write(
            lambda connection: import_checkpoint(
                connection, session_id, message.data, checkpoint_id=checkpoint_id, created_at_ms=now_ms
            )
        )
        return result  # a CheckpointMeta, or the SessionRefused the checkpoint store decided

    # -- the turn-end webhook --------------------------------------------------------------

    def _notifier(self) -> Any:
        """The configured deliveries: the settings' (tests) or the one the surface published."""
        return self.settings.notifier or webhook_deliveries_in(self.context.env)

    async def _decide_webhook(self, turn_id: str, status: str, reason: str | None) -> None:
        if self._notifier() is None or turn_id in self.notified_turns:
            return
        if self.subscribers:
            self.context.start_timer(
                f"webhook:{turn_id}", self.settings.webhook_recheck_seconds, _WebhookRecheck(turn_id, status, reason)
            )
            return
        await self._notify(turn_id, status, reason)

    async def _on_webhook_recheck(self, message: _WebhookRecheck) -> None:
        if self.subscribers or message.turn_id in self.notified_turns:
            return
        await self._notify(message.turn_id, message.status, message.reason)

    async def _notify(self, turn_id: str, status: str, reason: str | None) -> None:
        assert self.row is not None
        self.notified_turns[turn_id] = None
        while len(self.notified_turns) > notified_turns_remembered_max:
            self.notified_turns.popitem(last=False)
        notice = TurnEndNotice(
            session_id=self.session_id, end_user_id=self.row.end_user_id, turn_id=turn_id,
            status=status, last_seq=self.row.last_seq, reason=reason,  # type: ignore[arg-type]
        )
        self.context.trace("session_webhook", session=self.session_id, turn=turn_id)
        await self._notifier().enqueue_turn_end(notice)

    _handlers: dict[type, Callable[[SessionActor, Any], Awaitable[Any]]] = {
        PostInput: _post_input,
        Subscribe: _subscribe,
        Unsubscribe: _unsubscribe,
        Interrupt: _interrupt,
        CloseSession: _close,
        ReadMeta: _read_meta,
        ReadHistory: _read_history,
        AnswerTool: _answer_tool,
        AnswerPermission: _answer_permission,
        AnswerQuestion: _answer_question,
        Compact: _compact,
        ChangeCwd: _change_cwd,
        ListCheckpoints: _list_checkpoints,
        CreateCheckpoint: _create_checkpoint,
        RestoreCheckpoint: _restore_checkpoint,
        DeleteCheckpoint: _delete_checkpoint,
        ExportCheckpoint: _export_checkpoint,
        ImportCheckpoint: _import_checkpoint,
        **input_handlers,
    }


def _block_json(block: TextBlock | ImageBlock) -> dict[str, Any]:
    if isinstance(block, TextBlock):
        return {"t": "text", "text": block.text}
    return {"t": "image", "mime": block.mime, "data": block.data}


def _summary_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """A plain digest of folded messages: role and the text they carried, cut to a bound."""
    lines = [f"[已压缩 {len(messages)} 条较早的消息]"]
    for message in messages:
        content = message.get("content")
        if isinstance(content, str) and content:
            lines.append(f"{message.get('role')}: {content}")
    return "\n".join(lines)[:compact_summary_chars_max]


def session_actor_kind(settings: SessionSettings | None = None, **options: Any) -> ActorKind:
    """The ``session`` kind; ``options`` go to ``ActorKind`` (mailbox, idle and turn limits)."""
    resolved = settings or SessionSettings()
    return ActorKind(session_kind_name, lambda context: SessionActor(context, resolved), **options)


__all__ = [
    "SessionActor",
    "SessionSettings",
    "TurnEndNotifier",
    "TurnRunner",
    "queued_inputs_max",
    "session_actor_kind",
    "subscriber_sweep_seconds",
    "turn_abort_wait_seconds",
    "uncommitted_events_max",
    "unsealed_epoch_margin",
    "webhook_recheck_seconds",
]
