"""Goals, reminders, notifications and the events stream of the host surface, under faults.

Why over HTTP, like the rest of the host workload: the contract's promises about reminders
(published once per goal schedule, never for questions, held duplicates or finished goals; a
pull with a persisted cursor and the SSE stream together miss nothing; a resumed stream after
a restart starts with ``resync``; no token sees another scope's goal) are kept jointly by the
routes, the gate, the goals actor, its durable reminders, the notifications read model, the
events hub and storage.  So every operation goes through ``world.apps["host"]`` (the streaming
ASGI driver) while crashes, power losses, clock jumps and the runtime's fault points are armed.

It runs inside the ``host`` workload (``HostWorkload`` hands it a share of its steps and its
checkpoints, so ``troupe sim sweep --workload host`` covers it) and is also registered alone as
``host_goals`` for quick runs.  The two use different token names, so both may be selected.

What the hosts do (three tokens: all entries, the ``astrbot:`` prefix, one listed entry): post
goals with deadlines (aware times from 90 s in the past to 150 s ahead, and dates) and lead
times of 0-3 minutes (so near reminders are sometimes already due), questions, exact duplicates
(merged at once, 403 for a restricted token whose copy would merge into a global goal) and
similar ones (held for the background judgement, whose verdict is written into the content for
the judging model installed in ``services``: ``同一件`` merges, ``另一件`` keeps, ``说不准``
never decides); retry with the same ``host_key`` after unknown outcomes; complete, abandon,
move deadlines and lead times (with and without ``expected_revision``); list goals; pull
``/notifications`` from a cursor the host persists (only advanced after an answered pull); and
follow ``/events`` for a random while, resuming with ``Last-Event-ID`` (header or query) from
the last frame consumed, sometimes hanging up between two frames of one chunk, then pulling as
the contract recommends.  Every goal's content carries a unique tag ``#g<n>#`` so a frame or
an item can be traced back to what a host sent even when the acknowledgement was lost.

Invariants (on every answer and frame, after every restart against committed storage, and at
quiescence after 120 s of quiet):

- reminders: at most one publication per (goal, reminder kind, schedule revision); none for a
  question, none for a goal still held for judgement; no pending publication of a finished or
  merged goal, and no publication traced after a completion or abandonment was acknowledged;
  an active, injectable goal with a deadline has its ``due`` publication or its durable ``due``
  reminder row (after every restart), and at quiescence every deadline older than a slack has
  its ``due`` publication (and, in runs without clock jumps, every passed ``near`` moment of a
  goal not yet due its ``near`` one) - exactly once in ``/notifications``;
- pull: items ascending above ``after``, ``next_cursor`` the last id, only goal kinds, status
  ``taken`` or ``cancelled``, the first ``taken_at`` never rewritten (seen by pull or stream);
- stream: well-formed frames, every id ``<instance>:<seq>`` with the lifetime's instance (a new
  one after every restart) and seqs strictly increasing per connection and never repeated in a
  process; ``reminder`` frames only ``goal_reminder``, never ``cancelled``; a resumed stream of
  an earlier lifetime starts with ``resync cursor_unavailable``, one of this lifetime whose
  cursor is young does not resync; within a chain of connections resumed without resync, no
  deliverable notification (goal reminder, in scope, not cancelled) below the highest one
  consumed is skipped;
- scope: no pull item, frame or goal list shows a goal outside the token's scope;
- what hosts saw stays true: every acknowledged goal and every notification a host saw is in
  storage unchanged; after a final pull at quiescence, what each host got by pull or stream
  covers every notification in its scope (pull + SSE miss nothing).

Trade-off: reminders come from wall-clock deadlines a minute or two away, so a run of a few
hundred simulated seconds sees them fire; the 30-minute dedup fallback is only reached when
the clock jumps forward, and the hole check assumes fewer than 1000 notifications (the replay
window; it is skipped above).
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from troupe.auth import TokenScope, new_token_secret
from troupe.models import Completion, Usage

from ._asgi import AsgiDriver, AsgiError, AsgiResponse
from ._tokens import TokenGrant, write_tokens
from ._trace_queries import OverrunningTurns, PoisonedReminders, _TraceFollower
from ._violation import Violation
from ._workload import World, check_shares, choose_by_share, read_checkpoint, register_workload
from ._workload_http import HttpExchange, json_or_none, send_retrying, send_traced

api = "/api/v1"
client_pause_seconds_max = 0.2
request_seconds_max = 20.0
attempts_max = 4
retry_sleep_seconds_max = 3.0
follow_seconds_min = 0.5
follow_seconds_max = 20.0
hang_up_between_frames_share = 0.04
"""After each frame, the chance a host stops reading there (the rest of the chunk is unread)."""
pull_pages_max = 6
"""Pages one pull step reads before it stops (the cursor stays where the last page left it)."""
final_pull_pages_max = 50
deadline_offset_seconds_min = -90.0
deadline_offset_seconds_max = 150.0
due_slack_seconds = 30.0
"""At quiescence a deadline this far in the past must have its due publication (reminders may
fire up to 10 s late under the ``reminder_late`` fault, and the service wakes every second)."""
young_cursor_seconds = 600.0
"""Below the contract's 900 s replay window: a cursor this young in the same process must replay."""
notification_window_ids = 1000
"""The stream's replay window (``troupe.http.host._events``): the chain check assumes ids below it."""
host_key_share = 0.7

assert 0 < follow_seconds_min < follow_seconds_max
assert young_cursor_seconds < 900.0

goal_entries = ("astrbot:group-a", "astrbot:private-b", "qq:group-c", "wx:room-d")
_characters = ("春夏秋冬山水风云花鸟鱼虫日月星辰江河湖海松竹梅兰琴棋书画诗酒茶"
               "东西南北红橙黄绿青蓝紫金银铜铁石木火土天地人和家国城乡")
verdict_duplicate = "同一件"
verdict_distinct = "另一件"
verdict_undecided = "说不准"
_tag_pattern = re.compile(r"#g(\d+)#")

documented_codes: dict[int, frozenset[str]] = {
    400: frozenset({"bad_host", "invalid_request", "method_not_allowed"}),
    401: frozenset({"unauthorized"}),
    403: frozenset({"entry_forbidden"}),
    404: frozenset({"not_found"}),
    409: frozenset({"revision_conflict", "goal_merged"}),
    413: frozenset({"payload_too_large"}),
    429: frozenset({"rate_limited", "event_token_limit", "event_global_limit"}),
    500: frozenset({"internal_error"}),
    503: frozenset({"unavailable"}),
}
transient_statuses = frozenset({429, 500, 503})


@dataclass(frozen=True)
class GoalToken:
    name: str
    scope: TokenScope

    def sees(self, entry_id: str | None) -> bool:
        return entry_id is None or self.scope.allows(entry_id)


goal_token_scopes = (
    ("goals-all", TokenScope.all()),
    ("goals-astrbot", TokenScope.of_prefix("astrbot:")),
    ("goals-qq", TokenScope.of_entries(["qq:group-c"])),
)


@dataclass
class SentGoal:
    """One goal as a host sent it (retries resend ``body`` unchanged)."""

    tag: int
    token: str
    body: dict[str, Any]
    sequences: tuple[int, ...] = ()
    receipt: dict[str, Any] | None = None
    """The first acknowledged answer: a retry with the same host key must return it unchanged."""
    refused: bool = False


@dataclass
class _Seen:
    """A notification as hosts saw it (by pull or stream), first sighting kept."""

    goal_id: int
    kind: str
    reminder_kind: Any
    content: str
    sequence: int
    taken_at: str | None = None
    cancelled: bool = False


@dataclass
class _Chain:
    """Connections of one host resumed one from another without ``resync``: no hole allowed."""

    token: str
    consumed: set[int] = field(default_factory=set)
    sequences: list[int] = field(default_factory=list)


@dataclass
class _Host:
    """One token's host, with what it persists like a real one (cursor, last frame id)."""

    token: GoalToken
    pull_cursor: int = 0
    got: set[int] = field(default_factory=set)
    """Notification ids this host received by pull or by stream."""
    last_event_id: str | None = None
    last_event_time: float = 0.0
    """trio time at which the last frame was consumed (the cursor's age)."""
    chain: _Chain | None = None
    following: bool = False
    """A stream of this host is open (one subscription task per host)."""


class JudgingModel:
    """The Model port with a dedup judge: the goals actor's ``{"duplicate": bool}`` question is
    answered from the verdict words the workload wrote into the new goal's content; everything
    else goes to the wrapped model.  Deterministic (a pure function of the prompt)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = getattr(inner, "name", "sim-judge")
        self.capabilities = getattr(inner, "capabilities", frozenset())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def complete(self, request: Any) -> Any:
        system = " ".join(message.content for message in request.messages if message.role == "system")
        if "目标去重判断器" not in system:
            return await self.inner.complete(request)
        await trio.lowlevel.checkpoint()
        user = request.messages[-1].content
        new_goal = user.rsplit("新目标：", 1)[-1]
        if verdict_duplicate in new_goal:
            text = '{"duplicate": true}'
        elif verdict_distinct in new_goal:
            text = '{"duplicate": false}'
        else:
            text = "{}"
        return Completion(text=text, finish_reason="stop", usage=Usage(1, 1))


class HostGoalsWorkload:
    """See the module docstring.  ``label`` names its tokens (``sim-<label>-goals-...``)."""

    name = "host_goals"

    def __init__(self, label: str = "host_goals") -> None:
        self.tokens = tuple(GoalToken(f"sim-{label}-{suffix}", scope) for suffix, scope in goal_token_scopes)
        self.hosts = {token.name: _Host(token) for token in self.tokens}
        self.secrets: dict[str, str] = {}
        self.tokens_generation = 0
        self.counter = 0
        self.goals: list[SentGoal] = []
        self.by_tag: dict[int, SentGoal] = {}
        self.tag_entries: dict[int, set[str | None]] = {}
        """Content tag -> every entry a goal with that content was sent for."""
        self.goal_entries: dict[int, str | None] = {}
        """Goal id -> entry, from acknowledgements and lists."""
        self.goal_revisions: dict[int, int] = {}
        self.finished: dict[int, int] = {}
        """Goal id -> trace sequence of the acknowledged complete/abandon."""
        self.seen: dict[int, _Seen] = {}
        self.chains: list[_Chain] = []
        self.instances: dict[int, str] = {}
        """Generation -> the events instance id seen in it."""
        self.frame_seqs: dict[str, set[int]] = {}
        self._instance_checked: set[int] = set()
        self.responses = 0
        self.frames = 0
        self._pending: list[Violation] = []
        self._poisoned: PoisonedReminders | None = None
        self._overrunning: OverrunningTurns | None = None
        self._publications: _TraceFollower | None = None

    def actor_kinds(self, world: World) -> list[Any]:
        return []

    def migrations(self) -> list[Any]:
        return []

    def services(self, world: World) -> list[Any]:
        """No service: installs the judging model (see ``JudgingModel``) once per run."""
        if not isinstance(world.env.model, JudgingModel):
            world.env.model = JudgingModel(world.env.model)
        return []

    # ------------------------------------------------------------------ plumbing
    def _violate(self, text: str, sequences: tuple[int, ...] = ()) -> None:
        self._pending.append(Violation(f"host goals: {text}", sequences=sequences,
                                       actors=(("host_goals", "global"),), checker="host_goals"))

    def _take_pending(self) -> list[Violation]:
        pending, self._pending = self._pending, []
        return pending

    async def _ensure_tokens(self, world: World) -> bool:
        if self.tokens_generation == world.generation:
            return True
        if not self.secrets:
            self.secrets = {token.name: new_token_secret(world.random) for token in self.tokens}
        grants = [TokenGrant(token.name, token.scope, self.secrets[token.name]) for token in self.tokens]
        if not await write_tokens(world, grants):
            return False
        self.tokens_generation = world.generation
        return True

    def _headers(self, token: GoalToken, extra: tuple[tuple[str, str], ...] = ()) -> list[tuple[str, str]]:
        return [("content-type", "application/json"),
                ("authorization", f"Bearer {self.secrets[token.name]}"), *extra]

    async def _send(self, world: World, driver: AsgiDriver, token: GoalToken, method: str, path: str,
                    body: Any = None) -> tuple[AsgiResponse | None, Any, tuple[int, ...]]:
        exchange = await self._exchange(world, driver, token, method, path, body)
        return exchange.response, exchange.document, exchange.sequences

    async def _exchange(self, world: World, driver: AsgiDriver, token: GoalToken, method: str, path: str,
                        body: Any = None) -> HttpExchange:
        data = b"" if body is None else json.dumps(body, ensure_ascii=False).encode()
        exchange = await send_traced(world, driver, "host", method, path, violate=self._violate,
                                     envelope=_envelope_problem, invoke_labels={"token": token.name},
                                     headers=self._headers(token), body=data, seconds_max=request_seconds_max)
        self.responses += exchange.response is not None
        return exchange

    async def _send_retrying(self, world: World, driver: AsgiDriver, token: GoalToken, method: str, path: str,
                             body: Any = None) -> tuple[AsgiResponse | None, Any, tuple[int, ...]]:
        exchange = await send_retrying(world, lambda: self._exchange(world, driver, token, method, path, body),
                                       attempts_max=attempts_max, transient_statuses=transient_statuses,
                                       sleep_seconds_max=retry_sleep_seconds_max)
        return exchange.response, exchange.document, exchange.sequences

    def _unexpected(self, what: str, response: AsgiResponse | None, sequences: tuple[int, ...],
                    expected: str) -> None:
        if response is None or response.status in transient_statuses:
            return
        self._violate(f"{what} answered {response.status} {response.body[:160]!r}, expected {expected}", sequences)

    # ------------------------------------------------------------------ steps
    async def client_step(self, world: World, client: int) -> None:
        await trio.sleep(world.random.random() * client_pause_seconds_max)
        driver = world.apps.get("host")
        if driver is None or world.engine is None or not await self._ensure_tokens(world):
            return
        operation = choose_by_share(world.random.random(), _operations)
        if operation is not None:
            await operation(self, world, driver)

    def _pick_token(self, world: World) -> GoalToken:
        return self.tokens[world.random.randrange(0, len(self.tokens))]

    def _pick_entry(self, world: World, token: GoalToken) -> str:
        allowed = [entry for entry in goal_entries if token.scope.allows(entry)]
        return allowed[world.random.randrange(0, len(allowed))]

    def _next(self) -> int:
        self.counter += 1
        return self.counter

    def _deadline(self, world: World) -> str | None:
        roll = world.random.random()
        wall = world.env.clock.wall()
        if roll < 0.15:
            return None
        if roll < 0.25:
            day = datetime.datetime.fromtimestamp(wall, tz=datetime.UTC).date()
            return (day + datetime.timedelta(days=world.random.randrange(-1, 2))).isoformat()
        offset = deadline_offset_seconds_min + world.random.random() * (
            deadline_offset_seconds_max - deadline_offset_seconds_min)
        zone = datetime.timezone(datetime.timedelta(hours=8 if world.random.random() < 0.5 else 0))
        return datetime.datetime.fromtimestamp(int(wall + offset), tz=zone).isoformat()

    def _new_goal(self, world: World) -> SentGoal:
        token = self._pick_token(world)
        tag = self._next()
        roll = world.random.random()
        earlier = self.goals[world.random.randrange(0, len(self.goals))] if self.goals else None
        body: dict[str, Any]
        if earlier is not None and roll < 0.12:
            # An exact duplicate of an earlier goal (its tag too): merged while that one is active.
            body = {key: earlier.body[key] for key in ("content", "kind", "entry_id") if key in earlier.body}
            entry_id = body.get("entry_id")
            if entry_id is None and not token.scope.is_all or entry_id is not None and not token.scope.allows(entry_id):
                body["entry_id"] = self._pick_entry(world, token)
        elif earlier is not None and roll < 0.27:
            # A similar goal held for the background judgement, whose verdict its content names.
            verdict = (verdict_duplicate, verdict_distinct, verdict_undecided)[world.random.randrange(0, 3)]
            body = {key: earlier.body[key] for key in ("kind", "entry_id") if key in earlier.body}
            body["content"] = f"{earlier.body['content']} {verdict} #g{tag}#"
            entry_id = body.get("entry_id")
            if entry_id is None and not token.scope.is_all or entry_id is not None and not token.scope.allows(entry_id):
                body["entry_id"] = self._pick_entry(world, token)
        else:
            words = "".join(_characters[world.random.randrange(0, len(_characters))] for _ in range(10))
            body = {"content": f"{words} #g{tag}#"}
            if world.random.random() < 0.15:
                body["kind"] = "question"
            if token.scope.is_all and world.random.random() < 0.3 or world.random.random() < 0.05:
                body["entry_id"] = None  # global (403 for a restricted token)
            else:
                body["entry_id"] = self._pick_entry(world, token)
        deadline = self._deadline(world)
        if deadline is not None:
            body["deadline"] = deadline
        if world.random.random() < 0.8:
            body["reminder_minutes"] = world.random.randrange(0, 4)
        if world.random.random() < 0.3:
            body["people"] = ["小明"]
        if world.random.random() < host_key_share:
            body["host_key"] = f"goal-{tag}"
        goal = SentGoal(tag, token.name, body)
        # An exact copy reuses its original's tag: the tag then stands for every place it was sent to.
        self.tag_entries.setdefault(_last_tag(body["content"]), set()).add(body.get("entry_id"))
        self.goals.append(goal)
        self.by_tag[tag] = goal
        return goal

    async def create_goal(self, world: World, driver: AsgiDriver) -> None:
        retry = [goal for goal in self.goals if "host_key" in goal.body and goal.receipt is None and not goal.refused]
        if retry and world.random.random() < 0.25:
            goal = retry[world.random.randrange(0, len(retry))]
        else:
            goal = self._new_goal(world)
        token = next(token for token in self.tokens if token.name == goal.token)
        response, document, sequences = await self._send_retrying(world, driver, token, "POST", f"{api}/goals",
                                                                   goal.body)
        goal.sequences += sequences
        if response is None or response.status in transient_statuses:
            return
        entry_id = goal.body.get("entry_id")
        if response.status == 403:
            global_copy = any(other.body.get("entry_id") is None and other.body["content"] in goal.body["content"]
                              for other in self.goals if other is not goal)
            if token.scope.is_all or (entry_id is not None and not global_copy):
                self._violate(f"goal #g{goal.tag} of {token.name} refused with 403", sequences)
            goal.refused = True
            return
        if entry_id is None and not token.scope.is_all:
            self._violate(f"a restricted token {token.name} created a global goal: {response.status}", sequences)
            return
        if response.status != 201 or not isinstance(document, dict):
            self._unexpected(f"POST /goals #g{goal.tag}", response, sequences, "201")
            return
        kept, submitted_id = document.get("goal"), document.get("submitted_id")
        if not isinstance(kept, dict) or not isinstance(submitted_id, int) or not isinstance(document.get("dedup"), dict):
            self._violate(f"POST /goals #g{goal.tag} answered {response.body[:200]!r}", sequences)
            return
        if goal.receipt is not None and "host_key" in goal.body and document != goal.receipt:
            self._violate(f"a host-key retry of #g{goal.tag} did not return the first receipt", sequences)
        if goal.receipt is None:
            goal.receipt = document
        self._check_goal_document(token, kept, sequences, "POST /goals")
        self.goal_entries.setdefault(submitted_id, entry_id)
        self.goal_entries.setdefault(kept["id"], kept.get("entry_id"))
        self.goal_revisions[kept["id"]] = max(self.goal_revisions.get(kept["id"], 0), kept.get("revision", 0))

    def _check_goal_document(self, token: GoalToken, goal: dict[str, Any], sequences: tuple[int, ...], what: str) -> None:
        entry_id = goal.get("entry_id")
        if not token.sees(entry_id):
            self._violate(f"{what} showed {token.name} goal {goal.get('id')} of {entry_id}", sequences)
        pending, fallback = goal.get("dedup_pending"), goal.get("dedup_fallback_at")
        if not isinstance(pending, bool) or not isinstance(goal.get("dedup_injectable"), bool):
            self._violate(f"{what}: goal {goal.get('id')} lacks the dedup fields", sequences)
        elif not pending and fallback is not None:
            self._violate(f"{what}: goal {goal.get('id')} is not pending but has a fallback time", sequences)
        elif pending and goal.get("status") == "active" and fallback is None:
            self._violate(f"{what}: pending goal {goal.get('id')} without a fallback time", sequences)

    async def patch_goal(self, world: World, driver: AsgiDriver) -> None:
        known = sorted(self.goal_entries)
        if not known:
            return
        goal_id = known[world.random.randrange(0, len(known))]
        token = self._pick_token(world)
        entry_id = self.goal_entries[goal_id]
        roll = world.random.random()
        body: dict[str, Any]
        if roll < 0.35:
            body = {"status": "completed"}
        elif roll < 0.5:
            body = {"status": "abandoned"}
        elif roll < 0.8:
            body = {"deadline": self._deadline(world)}
        else:
            body = {"reminder_minutes": world.random.randrange(0, 4)}
        if world.random.random() < 0.3 and goal_id in self.goal_revisions:
            body["expected_revision"] = self.goal_revisions[goal_id]
        response, document, sequences = await self._send_retrying(world, driver, token, "PATCH",
                                                                   f"{api}/goals/{goal_id}", body)
        if response is None or response.status in transient_statuses:
            return
        allowed = token.scope.is_all or (entry_id is not None and token.scope.allows(entry_id))
        if response.status == 403:
            if allowed:
                self._violate(f"PATCH goal {goal_id} by {token.name} refused with 403", sequences)
            return
        if not allowed:
            self._violate(f"{token.name} changed goal {goal_id} of {entry_id} outside its scope: "
                          f"{response.status}", sequences)
            return
        if response.status in (400, 409):
            return  # finished goal, merged goal, stale revision: documented refusals
        if response.status != 200 or not isinstance(document, dict):
            self._unexpected(f"PATCH goal {goal_id}", response, sequences, "200")
            return
        self._check_goal_document(token, document, sequences, "PATCH /goals")
        self.goal_revisions[goal_id] = max(self.goal_revisions.get(goal_id, 0), document.get("revision", 0))
        if document.get("status") in ("completed", "abandoned"):
            self.finished.setdefault(goal_id, sequences[-1])

    async def list_goals(self, world: World, driver: AsgiDriver) -> None:
        token = self._pick_token(world)
        query = ["limit=100"]
        if world.random.random() < 0.4:
            query.append("status=active")
        if world.random.random() < 0.3:
            query.append(f"due={('none', 'upcoming', 'near', 'overdue')[world.random.randrange(0, 4)]}")
        response, document, sequences = await self._send_retrying(world, driver, token, "GET",
                                                                   f"{api}/goals?{'&'.join(query)}")
        if response is None or response.status != 200 or not isinstance(document, dict):
            self._unexpected("GET /goals", response, sequences, "200")
            return
        for item in document.get("items", []):
            if isinstance(item, dict) and isinstance(item.get("id"), int):
                self._check_goal_document(token, item, sequences, "GET /goals")
                self.goal_entries.setdefault(item["id"], item.get("entry_id"))
                self.goal_revisions[item["id"]] = max(self.goal_revisions.get(item["id"], 0), item.get("revision", 0))

    # ------------------------------------------------------------------ notifications
    def _check_item(self, host: _Host, item: Any, sequences: tuple[int, ...], how: str) -> int | None:
        """Common checks of a pull item or a reminder frame's data; its id, or None."""
        if not isinstance(item, dict) or not isinstance(item.get("id"), int) or not isinstance(item.get("goal_id"), int):
            self._violate(f"{how} item is malformed: {str(item)[:200]}", sequences)
            return None
        notification_id, goal_id, content = item["id"], item["goal_id"], str(item.get("content"))
        token = host.token
        entry = self.goal_entries.get(goal_id, "?")
        sent_entries = self.tag_entries.get(_last_tag(content), set())
        if not token.sees(entry) if entry != "?" else sent_entries and not any(map(token.sees, sent_entries)):
            self._violate(f"{how} showed {token.name} notification {notification_id} of goal {goal_id} "
                          f"outside its scope ({entry if entry != '?' else sorted(map(str, sent_entries))})", sequences)
        known = self.seen.get(notification_id)
        if known is None:
            self.seen[notification_id] = _Seen(goal_id, str(item.get("kind")), item.get("reminder_kind"), content,
                                               sequences[-1], item.get("taken_at"),
                                               how == "pull" and item.get("status") == "cancelled")
        else:
            if (known.goal_id, known.kind, known.reminder_kind, known.content) != (
                    goal_id, item.get("kind"), item.get("reminder_kind"), content):
                self._violate(f"notification {notification_id} changed: first goal {known.goal_id} "
                              f"{known.reminder_kind} {known.content[:40]!r}, now goal {goal_id} "
                              f"{item.get('reminder_kind')} {content[:40]!r}", (known.sequence, *sequences))
            taken_at = item.get("taken_at")
            # A frame may come from a snapshot older than a pull that was answered first, so
            # only two non-null taken_at values are compared, and cancellation only by pulls.
            if known.taken_at is not None and taken_at is not None and taken_at != known.taken_at:
                self._violate(f"notification {notification_id}: taken_at {known.taken_at} became {taken_at}",
                              (known.sequence, *sequences))
            if known.taken_at is None:
                known.taken_at = taken_at
            if how == "pull" and known.cancelled and item.get("status") != "cancelled":
                self._violate(f"notification {notification_id} was cancelled and is now {item.get('status')}",
                              (known.sequence, *sequences))
            known.cancelled = known.cancelled or how == "pull" and item.get("status") == "cancelled"
        host.got.add(notification_id)
        return notification_id

    async def pull(self, world: World, driver: AsgiDriver, host: _Host | None = None, *,
                   pages_max: int = pull_pages_max) -> bool:
        """Pull from the host's persisted cursor until ``has_more`` is false (or ``pages_max``);
        True when it got to the end."""
        host = host or self.hosts[self._pick_token(world).name]
        for _ in range(pages_max):
            limit = 100 if world.random.random() < 0.5 else world.random.randrange(1, 101)
            after = host.pull_cursor
            response, document, sequences = await self._send_retrying(
                world, driver, host.token, "GET", f"{api}/notifications?after={after}&limit={limit}")
            if response is None or response.status != 200 or not isinstance(document, dict):
                self._unexpected("GET /notifications", response, sequences, "200")
                return False
            items, next_cursor, has_more = document.get("items"), document.get("next_cursor"), document.get("has_more")
            if not isinstance(items, list) or not isinstance(next_cursor, int) or not isinstance(has_more, bool):
                self._violate(f"GET /notifications answered {response.body[:200]!r}", sequences)
                return False
            previous = after
            for item in items:
                notification_id = self._check_item(host, item, sequences, "pull")
                if notification_id is None:
                    continue
                if notification_id <= previous:
                    self._violate(f"pull after {after} returned {notification_id} after {previous}", sequences)
                previous = notification_id
                if item.get("status") not in ("taken", "cancelled") or item.get("taken_at") is None:
                    self._violate(f"pulled notification {notification_id} is {item.get('status')} "
                                  f"with taken_at {item.get('taken_at')}", sequences)
                if item.get("kind") not in ("goal_reminder", "goal_dedup"):
                    self._violate(f"pulled notification {notification_id} has kind {item.get('kind')!r}", sequences)
            if len(items) > limit or next_cursor != (items[-1].get("id") if items else after):
                self._violate(f"pull after {after} limit {limit}: {len(items)} items, next_cursor {next_cursor}",
                              sequences)
                return False
            host.pull_cursor = next_cursor  # persisted only after the page was processed
            if not has_more:
                return True
        return False

    # ------------------------------------------------------------------ the events stream
    async def follow(self, world: World, driver: AsgiDriver) -> None:
        host = self.hosts[self._pick_token(world).name]
        if host.following:
            # One subscription task per host, as the contract asks: this client pulls instead.
            await self.pull(world, driver, host)
            return
        host.following = True
        resume = host.last_event_id if host.last_event_id is not None and world.random.random() < 0.85 else None
        resume_age = trio.current_time() - host.last_event_time
        extra: tuple[tuple[str, str], ...] = (("accept", "text/event-stream"),)
        path = f"{api}/events"
        if resume is not None:
            if world.random.random() < 0.7:
                extra += (("last-event-id", resume),)
            else:
                path += f"?last_event_id={resume}"
        seconds = follow_seconds_min + world.random.random() * (follow_seconds_max - follow_seconds_min)
        invoked = world.tracer.record("http_invoke", "http", "host", method="GET", path=path, token=host.token.name)
        connection = _Connection(host, resume, resume_age, invoked, world.generation)
        connection.sequences = (invoked,)
        try:
            async with driver.stream("GET", path, headers=self._headers(host.token, extra),
                                     start_seconds_max=request_seconds_max) as stream:
                opened = world.tracer.record("http_ok", "http", "host", status=stream.status)
                connection.sequences = (invoked, opened)
                if stream.status != 200:
                    with trio.move_on_after(request_seconds_max):
                        body = await stream.read()
                        response = AsgiResponse(stream.status, stream.headers, body)
                        problem = _envelope_problem(response, json_or_none(body))
                        if problem:
                            self._violate(f"GET /events answered {stream.status}: {problem}", connection.sequences)
                        elif stream.status not in (429, 503):
                            self._violate(f"GET /events answered {stream.status} {body[:160]!r}", connection.sequences)
                        elif stream.status == 429 and json_or_none(body)["error"]["code"].startswith("event_") \
                                and stream.header("retry-after") != "5":
                            self._violate("a connection-limit 429 without Retry-After: 5", connection.sequences)
                    return
                with trio.move_on_after(seconds):
                    buffer = b""
                    async for chunk in stream:
                        buffer += chunk
                        while b"\n\n" in buffer:
                            block, buffer = buffer.split(b"\n\n", 1)
                            self._on_frame(world, connection, block)
                            if world.random.random() < hang_up_between_frames_share:
                                return  # stops reading here: the rest of this chunk is never consumed
        except AsgiError:
            world.tracer.record("http_fail", "http", "host", path=path)
        finally:
            host.following = False
        if connection.resynced or connection.frames and world.random.random() < 0.8:
            # The contract's host: after a resync or any end of the stream, pull again.
            await self.pull(world, driver, host)

    def _on_frame(self, world: World, connection: _Connection, block: bytes) -> None:
        host = connection.host
        event = frame_id = data_text = None
        for line in block.decode("utf-8", "replace").split("\n"):
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("id: "):
                frame_id = line[4:]
            elif line.startswith("data: "):
                if data_text is not None:
                    self._violate(f"a frame with more than one data line: {block[:160]!r}", connection.sequences)
                data_text = line[6:]
        sequences = connection.sequences
        data = json_or_none((data_text or "").encode())
        match = re.fullmatch(r"([0-9a-f]{32}):([0-9]+)", frame_id or "")
        if match is None or event not in ("reminder", "heartbeat", "resync") or not isinstance(data, dict):
            self._violate(f"malformed frame {block[:200]!r}", sequences)
            return
        self.frames += 1
        instance, seq = match.group(1), int(match.group(2))
        first = not connection.frames
        connection.frames += 1
        known_instance = self.instances.setdefault(connection.generation, instance)
        if instance != known_instance:
            self._violate(f"two instance ids in one process lifetime: {known_instance} and {instance}", sequences)
        elif first and connection.generation not in self._instance_checked:
            self._instance_checked.add(connection.generation)
            earlier = {value for generation, value in self.instances.items() if generation != connection.generation}
            if instance in earlier:
                self._violate(f"instance id {instance} reused after a restart", sequences)
        seqs = self.frame_seqs.setdefault(instance, set())
        if seq in seqs:
            self._violate(f"frame id {frame_id} sent twice", sequences)
        seqs.add(seq)
        if connection.last_seq is not None and seq <= connection.last_seq:
            self._violate(f"frame seq {seq} after {connection.last_seq} on one connection", sequences)
        connection.last_seq = seq
        if first:
            self._on_first_frame(connection, instance, event, data)
        world.tracer.record(f"host_events_{event}", "http", "host", seq=seq)
        if event == "resync":
            connection.resynced = True
            if data.get("reason") not in ("cursor_unavailable", "window_exceeded") or \
                    data.get("pull_url") != f"{api}/notifications":
                self._violate(f"resync frame {data_text}", sequences)
            if not first:
                self._violate("a resync frame after the start of a stream", sequences)
        elif event == "heartbeat":
            if set(data) != {"time"}:
                self._violate(f"heartbeat carries {sorted(data)}", sequences)
        else:
            notification_id = self._check_item(host, data, sequences, "stream")
            if notification_id is not None:
                if data.get("kind") != "goal_reminder" or data.get("status") == "cancelled":
                    self._violate(f"reminder frame of notification {notification_id}: kind {data.get('kind')}, "
                                  f"status {data.get('status')}", sequences)
                if connection.last_notification is not None and notification_id <= connection.last_notification:
                    self._violate(f"reminder {notification_id} after {connection.last_notification} on one "
                                  f"connection", sequences)
                connection.last_notification = notification_id
                assert connection.chain is not None
                connection.chain.consumed.add(notification_id)
        # The host persists the frame id once it handled the frame (the contract's cursor).
        host.last_event_id = frame_id
        host.last_event_time = trio.current_time()
        host.chain = connection.chain

    def _on_first_frame(self, connection: _Connection, instance: str, event: str, data: dict[str, Any]) -> None:
        host, resume = connection.host, connection.resume
        resumed_instance = resume.split(":", 1)[0] if resume else None
        if resume is not None and resumed_instance != instance:
            if event != "resync" or data.get("reason") != "cursor_unavailable":
                self._violate(f"a stream resumed from another process lifetime's {resume} started with {event} "
                              f"{data}, not resync cursor_unavailable", connection.sequences)
        elif (resume is not None and event == "resync" and data.get("reason") == "cursor_unavailable"
              and connection.resume_age < young_cursor_seconds):
            self._violate(f"a stream resumed from {resume} ({connection.resume_age:.0f} s old, same process) "
                          f"started with resync {data.get('reason')}", connection.sequences)
        if resume is None or event == "resync" or host.chain is None:
            connection.chain = _Chain(host.token.name)
            self.chains.append(connection.chain)
        else:
            connection.chain = host.chain
        connection.chain.sequences.append(connection.sequences[0])

    async def events_status(self, world: World, driver: AsgiDriver) -> None:
        token = self._pick_token(world)
        response, document, sequences = await self._send_retrying(world, driver, token, "GET", f"{api}/events/status")
        if response is None or response.status != 200 or not isinstance(document, dict):
            self._unexpected("GET /events/status", response, sequences, "200")
            return
        instance = document.get("instance_id")
        known = self.instances.setdefault(world.generation, instance)
        if instance != known:
            self._violate(f"/events/status says instance {instance}, the streams said {known}", sequences)
        if not isinstance(document.get("connections"), int) or not 0 <= document["connections"] <= 32:
            self._violate(f"/events/status connections {document.get('connections')!r}", sequences)

    async def bad_request(self, world: World, driver: AsgiDriver) -> None:
        """Refusals that must change nothing: unknown stream parameters, conflicting cursors,
        a pull limit above 100."""
        host = self.hosts[self._pick_token(world).name]
        choice = world.random.randrange(0, 3)
        if choice == 0:
            path, extra = f"{api}/events?entry_id=qq:group-c", ()
        elif choice == 1:
            path = f"{api}/events?last_event_id={'0' * 32}:1"
            extra = (("last-event-id", f"{'0' * 32}:2"),)
        else:
            path, extra = f"{api}/notifications?after={host.pull_cursor}&limit=101", ()
        invoked = world.tracer.record("http_invoke", "http", "host", method="GET", path=path, token=host.token.name)
        try:
            response = await driver.request("GET", path, headers=self._headers(host.token, extra),
                                            seconds_max=request_seconds_max)
        except AsgiError:
            return
        sequences = (invoked, world.tracer.record("http_ok", "http", "host", status=response.status))
        if response.status in transient_statuses:
            return
        document = json_or_none(response.body)
        problem = _envelope_problem(response, document) if response.status >= 400 else "not refused"
        if problem or document["error"]["code"] != "invalid_request":
            self._violate(f"GET {path} answered {response.status} {response.body[:160]!r}: {problem}", sequences)

    # ------------------------------------------------------------------ invariants
    async def after_restart(self, world: World) -> list[Violation]:
        if world.engine is not None:
            await self._check_storage(world, quiescent=False)
        return self._take_pending()

    async def at_quiescence(self, world: World) -> list[Violation]:
        driver = world.apps.get("host")
        if world.engine is not None and driver is not None and self.tokens_generation and await self._ensure_tokens(world):
            for host in self.hosts.values():
                if not await self.pull(world, driver, host, pages_max=final_pull_pages_max):
                    host.pull_cursor = -1  # could not finish: no coverage check for this host
        if world.engine is not None:
            await self._check_storage(world, quiescent=True)
        return self._take_pending()

    def _excused(self, world: World) -> tuple[set[int], bool]:
        if self._poisoned is None:
            self._poisoned, self._overrunning = PoisonedReminders(world.tracer), OverrunningTurns(world.tracer)
        poisoned = set()
        for _, name in self._poisoned.of_kind("host_goals"):
            parts = str(name).split(":")
            if len(parts) == 3 and parts[1].isdigit():
                poisoned.add(int(parts[1]))
        assert self._overrunning is not None
        return poisoned, ("host_goals", "global") in self._overrunning.current()

    def _check_publications_after_finish(self, world: World) -> None:
        if self._publications is None:
            self._publications = _TraceFollower(world.tracer, (b"goal_reminder_published",))
        for sequence, _, event, _, _, fields in self._publications.new_records():
            if event != "goal_reminder_published":
                continue
            finished = self.finished.get(fields.get("goal_id"))
            if finished is not None and sequence > finished:
                self._violate(f"goal {fields.get('goal_id')} published notification {fields.get('notification_id')} "
                              f"after its completion or abandonment was acknowledged", (finished, sequence))

    async def _check_storage(self, world: World, *, quiescent: bool) -> None:
        self._check_publications_after_finish(world)
        snapshot = await read_checkpoint(world, _read_snapshot, self._violate)
        if snapshot is None:
            return
        now = world.env.clock.wall()
        poisoned, overrunning = self._excused(world)
        goals, notifications = snapshot.goals, snapshot.notifications
        published: dict[tuple[int, str, int], list[int]] = {}
        for row in notifications.values():
            if row.kind == "goal_reminder":
                published.setdefault((row.goal_id, row.reminder_kind, row.schedule_revision), []).append(row.id)
        for (goal_id, reminder_kind, revision), ids in published.items():
            if len(ids) > 1:
                self._violate(f"goal {goal_id} published {reminder_kind} {len(ids)} times for schedule {revision}: {ids}")
        for row in notifications.values():
            goal = goals.get(row.goal_id)
            if goal is None:
                self._violate(f"notification {row.id} names goal {row.goal_id}, which is not stored")
                continue
            if row.kind == "goal_reminder" and goal.kind == "question":
                self._violate(f"question goal {goal.id} published a {row.reminder_kind} reminder ({row.id})")
            if row.kind == "goal_reminder" and goal.held:
                self._violate(f"goal {goal.id}, held for dedup judgement, published reminder {row.id}")
            if row.kind == "goal_reminder" and goal.status != "active" and row.status == "pending":
                self._violate(f"goal {goal.id} is {goal.status} but notification {row.id} is still pending")
        for goal in goals.values():
            self._check_goal(goal, snapshot, published, now, quiescent, goal.id in poisoned or overrunning,
                             world.env.clock.jumps == 0)
        self._check_seen(snapshot)
        for goal in self.goals:
            if goal.receipt is not None and goal.receipt["submitted_id"] not in goals:
                self._violate(f"goal #g{goal.tag} was acknowledged as {goal.receipt['submitted_id']} but is not stored",
                              goal.sequences[-1:])
        for goal_id, sequence in self.finished.items():
            stored = goals.get(goal_id)
            if stored is None or stored.status not in ("completed", "abandoned"):
                self._violate(f"goal {goal_id}'s acknowledged completion is lost: "
                              f"{None if stored is None else stored.status}", (sequence,))
        if quiescent:
            self._check_coverage(snapshot)

    def _check_goal(self, goal: _GoalRow, snapshot: _Snapshot, published: dict[tuple[int, str, int], list[int]],
                    now: float, quiescent: bool, excused: bool, steady_clock: bool) -> None:
        names = snapshot.reminders.get(goal.id, set())
        if goal.status != "active" or goal.kind == "question" or goal.deadline_at is None or goal.held:
            stray = names - ({"fallback"} if goal.held else set())
            if stray:
                self._violate(f"goal {goal.id} ({goal.status}, {goal.kind}, held {goal.held}) keeps reminders "
                              f"{sorted(stray)}")
            if goal.held and goal.status == "active" and "fallback" not in names and not excused:
                self._violate(f"held goal {goal.id} has no fallback reminder: it would stay hidden for good")
            return
        due = (goal.id, "due", goal.schedule_revision) in published
        if not due and "due" not in names and not excused:
            self._violate(f"goal {goal.id} (deadline {goal.deadline_at:.0f}, schedule {goal.schedule_revision}) "
                          f"has neither its due publication nor its due reminder")
        if not quiescent or excused:
            return
        if goal.deadline_at <= now - due_slack_seconds and not due:
            self._violate(f"goal {goal.id}'s deadline passed {now - goal.deadline_at:.0f} s ago without its due "
                          f"reminder (schedule {goal.schedule_revision})")
        near_at = goal.near_at
        near = (goal.id, "near", goal.schedule_revision) in published
        if steady_clock and near_at is not None and near_at <= now - due_slack_seconds < goal.deadline_at - due_slack_seconds \
                and not near:
            self._violate(f"goal {goal.id}'s near moment passed {now - near_at:.0f} s ago without its near reminder")

    def _check_seen(self, snapshot: _Snapshot) -> None:
        for notification_id, seen in self.seen.items():
            row = snapshot.notifications.get(notification_id)
            if row is None:
                self._violate(f"notification {notification_id} a host received is not stored", (seen.sequence,))
            elif (row.goal_id, row.kind, row.reminder_kind, row.content) != (
                    seen.goal_id, seen.kind, seen.reminder_kind, seen.content):
                self._violate(f"notification {notification_id} a host received as goal {seen.goal_id} "
                              f"{seen.reminder_kind} is stored as goal {row.goal_id} {row.reminder_kind}",
                              (seen.sequence,))

    def _check_coverage(self, snapshot: _Snapshot) -> None:
        rows = snapshot.notifications
        for host in self.hosts.values():
            token = host.token
            visible = {row.id for row in rows.values() if token.sees(row.entry_id)}
            if host.pull_cursor >= 0:
                missed = sorted(notification_id for notification_id in visible
                                if notification_id <= host.pull_cursor and notification_id not in host.got)
                if missed or host.pull_cursor < max(visible, default=0):
                    self._violate(f"{token.name} pulled to {host.pull_cursor} and streamed, yet never got "
                                  f"notifications {missed[:10]} of {len(visible)} in its scope")
        if rows and max(rows) > notification_window_ids:
            return
        for chain in self.chains:
            if not chain.consumed:
                continue
            token = self.hosts[chain.token].token
            highest = max(chain.consumed)
            holes = sorted(row.id for row in rows.values()
                           if row.id < highest and row.id not in chain.consumed and row.kind == "goal_reminder"
                           and row.status != "cancelled" and token.sees(row.entry_id))
            if holes:
                self._violate(f"{token.name}'s stream, resumed without resync, skipped deliverable notifications "
                              f"{holes[:10]} below {highest}", tuple(chain.sequences[-4:]))


@dataclass
class _Connection:
    host: _Host
    resume: str | None
    resume_age: float
    invoked: int
    generation: int
    sequences: tuple[int, ...] = ()
    frames: int = 0
    last_seq: int | None = None
    last_notification: int | None = None
    resynced: bool = False
    chain: _Chain | None = None


@dataclass
class _GoalRow:
    id: int
    kind: str
    status: str
    deadline_at: float | None
    reminder_minutes: int
    schedule_revision: int
    held: bool
    """Pending dedup judgement and not released: hidden, no reminders."""

    @property
    def near_at(self) -> float | None:
        if self.deadline_at is None or self.reminder_minutes <= 0:
            return None
        return self.deadline_at - self.reminder_minutes * 60.0


@dataclass
class _NotificationRow:
    id: int
    kind: str
    goal_id: int
    entry_id: str | None
    reminder_kind: str | None
    schedule_revision: int
    content: str
    status: str


@dataclass
class _Snapshot:
    goals: dict[int, _GoalRow]
    notifications: dict[int, _NotificationRow]
    reminders: dict[int, set[str]]
    """Goal id -> names (``near``, ``due``, ``fallback``) of its durable reminder rows."""


def _read_snapshot(connection: Any) -> _Snapshot:
    """The goals checks' view of committed storage, from one read transaction (plain SQL
    written here, not the goals module's code)."""
    goals = {
        row[0]: _GoalRow(row[0], row[1], row[2], row[3], row[4], row[5],
                         row[6] == "pending" and row[7] is None)
        for row in connection.execute(
            "SELECT id, kind, status, deadline_at, reminder_minutes, schedule_revision, dedup_state, "
            "dedup_released_at FROM host_goals")
    }
    notifications = {
        row[0]: _NotificationRow(*row)
        for row in connection.execute(
            "SELECT id, kind, goal_id, entry_id, reminder_kind, schedule_revision, content, status "
            "FROM host_notifications")
    }
    reminders: dict[int, set[str]] = {}
    for (name,) in connection.execute("SELECT name FROM reminders WHERE kind = 'host_goals'"):
        parts = str(name).split(":")
        if len(parts) == 3 and parts[0] == "goal" and parts[1].isdigit():
            reminders.setdefault(int(parts[1]), set()).add(parts[2])
    return _Snapshot(goals, notifications, reminders)


def _last_tag(content: str) -> int:
    tags = _tag_pattern.findall(content)
    return int(tags[-1]) if tags else 0


def _envelope_problem(response: AsgiResponse, document: Any) -> str | None:
    from ._host_workload import envelope_problem

    return envelope_problem(response, document, codes=documented_codes)


Operation = Callable[[HostGoalsWorkload, World, AsgiDriver], Awaitable[Any]]
_operations: tuple[tuple[float, Operation], ...] = (
    (0.30, HostGoalsWorkload.create_goal),
    (0.12, HostGoalsWorkload.patch_goal),
    (0.06, HostGoalsWorkload.list_goals),
    (0.20, HostGoalsWorkload.pull),
    (0.26, HostGoalsWorkload.follow),
    (0.03, HostGoalsWorkload.events_status),
    (0.03, HostGoalsWorkload.bad_request),
)
check_shares(_operations)

# Not in the default selection: the ``host`` workload runs this part already.
register_workload("host_goals", HostGoalsWorkload, in_default=False)

__all__ = ["HostGoalsWorkload", "JudgingModel", "documented_codes", "goal_token_scopes"]
