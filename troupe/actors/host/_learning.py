"""The learners ``("learner", "0")`` …: turn closed batches into memories through the Model port.

Why actors and durable reminders rather than a background task: a batch must never be lost.
The entry actor that closes a batch writes its learner's ``claim`` reminder in the same
transaction, and a learner handles that reminder by running its open batches one after the
other; the reminder row is only deleted once the turn returned, so a crash (or a restart of the
whole server) fires it again and the learner resumes its ``running`` batch.  Concurrency is
bounded by the number of learners (``learner_workers_max``), and an entry's batches always go
to the same learner, so they are learned in order.

One batch, step by step (``_run_batch``):
1. claim it (``running``, attempts + 1);
2. understand the batch's images, then build the material: each message's sender, occurred
   time, text and quote, and its media as text (``_understand_images``, below);
3. ask the model (JSON mode) for memories, bounded by ``model_call_timeout_seconds``; a
   ``CpuBoundModel`` (the LocalModel) answers in the Env executor, with the composing of the
   request and the reading of its answer, in one hop (``_learn_sync``): a 100-message batch is
   milliseconds of regex work that would otherwise run on the event loop beside intake
   (a worker thread in production; inline, hence deterministic, in the simulator);
4. store the memories and mark the batch ``succeeded`` (messages ``learned``) in one
   transaction (``store_memories``' ``in_transaction``).

Failures: ``ModelUnavailable`` means the model is paused — the batch goes back to ``waiting``,
the pause is recorded (``/learn`` and ``/status`` report it) and the learner tries again after
``pause_retry_seconds``: nothing is abandoned while paused.  Any other model failure is retried
``model_attempts_max`` times in all (with ``retry_backoff_seconds`` between), then the batch is
``abandoned`` with the error as its reason.  A completion that ends with ``content_filter`` is
``refused`` at once (never retried another way, as the contract asks).

Images (the contract's media rules): an understanding already stored on the media object is
reused as given (the host's, or one a model produced for an earlier batch); every other image
of the batch is described by the model, each object once, when the model can see
(``describes_images``), all of them within ONE ``image_understanding_budget_seconds`` per
batch (each call gets what is left).  Each result is written back to the object durably
(``record_media_understanding``) before the material is composed, so a retried or restarted
batch does not pay for it again.  A failure (error, timeout, spent budget) reads
``[图片，未理解]`` and records only ``last_error``, so a later batch may try again; an
explicit content-safety refusal (``ModelRefused``) reads ``敏感信息无法访问``, is stored as
the object's understanding and is never retried another way.  A model that cannot see (the
LocalModel) leaves every image as ``[图片，未理解]`` without a call.  Audio and video stay
attachments with placeholders (``[音频]``, ``[视频]``) and never reach a model.

The LocalModel answers ``{"facts":[{"kind","text"}], "summary"}``; a richer model may answer
``{"memories":[{"content","kind","stance","lifecycle","belief","people","message_ids"}]}``.
Both are read; a fact is attributed to the messages it came from by its ``[m<id>]`` tag or,
failing that, by its text.
"""

from __future__ import annotations

import datetime
import functools
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import apsw
import trio

from troupe.models import (
    ChatMessage,
    Completion,
    CompletionRequest,
    CpuBoundModel,
    LocalModel,
    ModelError,
    ModelRefused,
    ModelUnavailable,
    describes_images,
)
from troupe.runtime import Actor, ActorContext, ActorKind
from troupe.storage import blob_get, reminder_set

from ._batches import (
    ClaimedBatch,
    batch_state_abandoned,
    batch_state_refused,
    batch_state_succeeded,
    claim_batch,
    claim_reminder_name,
    finish_batch,
    learner_kind_name,
    learner_workers_max,
    model_state,
    model_state_put,
    open_batches_of,
    record_model_call,
    release_batch,
)
from ._media_store import load_media, record_media_understanding, understanding_text_bytes_max
from ._memories import NewMemory

image_understanding_budget_seconds = 120.0
"""The contract's budget for understanding a batch's images (all of them together)."""
image_error_characters_max = 500
"""``last_error`` written back to a media object (diagnostics, not the provider's essay)."""
model_call_timeout_seconds = 120.0
model_attempts_max = 3
retry_backoff_seconds = 30.0
pause_retry_seconds = 60.0
learner_turn_timeout_seconds = 600.0
"""One claim turn: image budget + one model call + storage, with room to spare."""
memories_per_batch_max = 200
batches_per_turn_max = 100
claim_turn_budget_seconds = 240.0
"""A claim turn starts no new batch after this long (or after ``batches_per_turn_max``); it
re-arms its reminder and yields, so one learner never holds its turn indefinitely."""
continue_after_seconds = 0.001
material_characters_max = 200_000

image_placeholder = "[图片，未理解]"
image_refused_text = "敏感信息无法访问"
audio_placeholder = "[音频]"
video_placeholder = "[视频]"

default_stance = "observed"
"""Learned from what someone said in a chat: the character heard it, it did not live it."""
default_lifecycle = "active"
default_belief = 0.7
"""Someone said it about themselves: likely, not verified."""
local_kinds = {"preference": "preference", "plan": "plan", "personal": "fact"}

assert learner_turn_timeout_seconds > (
    claim_turn_budget_seconds + image_understanding_budget_seconds + model_call_timeout_seconds
)
assert model_attempts_max >= 1

_learn_instruction = (
    "从以下聊天消息中提取值得记住的事实（facts），每条一句。以 JSON 回答："
    '{"memories":[{"content","kind","stance","lifecycle","belief","people","message_ids"}]}。'
    "消息以 [m编号] 开头，message_ids 填写出处编号。"
)
_tag = re.compile(r"^\s*(?:[-*]\s*)?\[m(\d+)\]\s*(?:[^\n]{0,400}?）：)?\s*")
"""A line's ``[m<id>] sender（occurred_at）：`` head, as ``MaterialMessage.line`` writes it."""


@dataclass(frozen=True)
class MaterialMessage:
    """One message as the learner reads it (media already turned into text)."""

    id: int
    sender: str
    content: str
    occurred_at: str
    quote_author: str | None
    quote_content: str | None
    media_texts: tuple[str, ...] = ()

    def line(self) -> str:
        parts = [f"[m{self.id}] {self.sender}（{self.occurred_at}）：{self.content}"]
        parts.extend(self.media_texts)
        if self.quote_content:
            parts.append(f"（引用 {self.quote_author or '某人'}：{self.quote_content}）")
        return " ".join(part for part in parts if part)


MemoryStore = Callable[[Sequence[NewMemory], Callable[[apsw.Connection, list[int]], None]], Awaitable[list[int]]]
"""Stores memories and runs the callback in the same transaction; returns the memory ids."""


def host_memory_store(engine: Any, embedder: Any, wall: Callable[[], float]) -> MemoryStore:
    """The real store: ``store_memories`` on the engine's shared ``MemoryIndex``."""
    from ._memories import TokenizedDatabase, host_memory_indexes, store_memories

    async def store(memories: Sequence[NewMemory], in_transaction: Callable[[apsw.Connection, list[int]], None]) -> list[int]:
        index = await host_memory_indexes.index_for(engine, embedder)
        return await store_memories(
            TokenizedDatabase(engine), index, list(memories), created_at=wall(), in_transaction=in_transaction
        )

    return store


class LearnerActor(Actor):
    """See the module docstring.  ``memory_store`` defaults to the real memory store."""

    def __init__(self, context: ActorContext, *, memory_store: MemoryStore | None = None) -> None:
        super().__init__(context)
        env = context.env
        self.model = env.model if env.model is not None else LocalModel()
        self.memory_store = memory_store or host_memory_store(context.storage, env.embedder, env.clock.wall)

    async def on_activate(self) -> None:
        # A claim reminder that was poisoned (crashed twice) is gone: re-arm it if work remains.
        key = self.context.key
        remaining = await self.context.storage.read(lambda connection: open_batches_of(connection, key))
        if remaining:
            await self.context.set_reminder(claim_reminder_name, self.context.env.clock.wall())

    async def receive(self, message: Any) -> Any:
        raise AssertionError(f"learner got an unknown message {type(message).__name__}")

    async def on_reminder(self, name: str, payload: Any) -> None:
        if name != claim_reminder_name:
            return
        key = self.context.key
        clock = self.context.env.clock
        started = clock.monotonic()
        for _ in range(batches_per_turn_max):
            if clock.monotonic() - started > claim_turn_budget_seconds:
                break
            now = clock.wall()
            claimed = await self.context.storage.write(
                lambda connection, now=now: claim_batch(connection, key, now)
            )
            if claimed is None:
                return
            retry_at = await self._run_batch(claimed)
            if retry_at is not None:
                self.context.reminder_armed(claim_reminder_name, retry_at)
                return
        # More may wait: leave the mailbox a turn, then carry on (the reminder is durable).
        # (A due time after the firing one: the runtime deletes the fired row only if unchanged.)
        await self.context.set_reminder(claim_reminder_name, clock.wall() + continue_after_seconds)

    async def _run_batch(self, batch: ClaimedBatch) -> float | None:
        """Runs one claimed batch to an end state, or releases it and returns when to retry."""
        self.context.trace("batch_running", batch=batch.batch_id, attempt=batch.attempts)
        material = await self.context.storage.read(lambda connection: load_material(connection, batch.message_ids))
        material = await self._understand_images(material)
        clock = self.context.env.clock
        started = clock.monotonic()
        try:
            with trio.fail_after(model_call_timeout_seconds):
                completion, memories = await self._complete(material, batch.entry_id)
        except (ModelError, trio.TooSlowError) as error:
            seconds = clock.monotonic() - started
            return await self._failed(batch, error, seconds)
        seconds = clock.monotonic() - started
        if completion.finish_reason == "content_filter":
            await self._finish(batch, batch_state_refused, {"memory_ids": [], "memories_created": 0},
                               "content_filter", seconds, "refused")
            return None
        now = clock.wall()

        def in_transaction(connection: apsw.Connection, memory_ids: list[int]) -> None:
            _finish_job(connection, batch, batch_state_succeeded,
                        {"memory_ids": memory_ids, "memories_created": len(memory_ids)}, None, now, seconds, "ok")

        if memories:
            await self.memory_store(memories, in_transaction)
        else:
            await self.context.storage.write(lambda connection: in_transaction(connection, []))
        self.context.trace("batch_finished", batch=batch.batch_id, state=batch_state_succeeded)
        return None

    async def _complete(self, material: list[MaterialMessage], entry_id: str) -> tuple[Completion, list[NewMemory]]:
        """The model's answer to the material and the memories read from it (step 3)."""
        if isinstance(self.model, CpuBoundModel):
            # The checkpoint LocalModel.complete takes, so the simulator's schedule is unchanged.
            await trio.lowlevel.checkpoint()
            return await self.context.env.executor.run_sync(_learn_sync, self.model, material, entry_id)
        completion = await self.model.complete(learning_request(material))
        return completion, memories_from(completion.text, material, entry_id)

    async def _failed(self, batch: ClaimedBatch, error: BaseException, seconds: float) -> float | None:
        """Releases the batch (with the reminder that retries it, in one transaction) and
        returns the retry time, or abandons it once its attempts are spent."""
        now = self.context.env.clock.wall()
        reason = f"{type(error).__name__}: {error}"[:500]
        entry_id, key = batch.entry_id, self.context.key
        paused = isinstance(error, ModelUnavailable)
        if not paused and batch.attempts >= model_attempts_max:
            await self._finish(batch, batch_state_abandoned, {"memory_ids": [], "memories_created": 0, "error": reason},
                               reason, seconds, "error")
            return None
        retry_at = now + (pause_retry_seconds if paused else retry_backoff_seconds)

        def release(connection: apsw.Connection) -> None:
            outcome = "unavailable" if paused else "error"
            record_model_call(connection, at=now, seconds=seconds, outcome=outcome, purpose="learn", entry_id=entry_id)
            release_batch(connection, batch.batch_id, reason)
            reminder_set(connection, learner_kind_name, key, claim_reminder_name, retry_at, None)
            if paused:
                model_state_put(connection, paused=True, reason=reason, paused_since=now, last_error=reason,
                                last_failure_at=now)
            else:
                model_state_put(connection, last_error=reason, last_failure_at=now)

        await self.context.storage.write(release)
        self.context.trace("batch_released", batch=batch.batch_id, reason="paused" if paused else "retry")
        return retry_at
    async def _finish(self, batch: ClaimedBatch, state: str, result: dict, reason: str | None,
                      seconds: float, outcome: str) -> None:
        now = self.context.env.clock.wall()
        await self.context.storage.write(
            lambda connection: _finish_job(connection, batch, state, result, reason, now, seconds, outcome)
        )
        self.context.trace("batch_finished", batch=batch.batch_id, state=state)

    async def _understand_images(self, material: list[MaterialMessage]) -> list[MaterialMessage]:
        """Replaces the pending-image markers (see the module docstring): each media object
        once, by the model when it can see and the batch's budget lasts, else the placeholder."""
        pending = list(dict.fromkeys(
            media_id for message in material for text in message.media_texts
            if (media_id := _pending_media_id(text)) is not None
        ))
        if not pending:
            return material
        texts = await self._describe_images(pending) if describes_images(self.model) else {}
        return [_replace_pending(message, texts) for message in material]

    async def _describe_images(self, media_ids: Sequence[str]) -> dict[str, str]:
        """The material text of each image understood within the batch's one budget; each
        outcome is committed to its media object before the next image starts."""
        clock = self.context.env.clock
        deadline = clock.monotonic() + image_understanding_budget_seconds
        texts: dict[str, str] = {}
        for media_id in media_ids:
            remaining_seconds = deadline - clock.monotonic()
            if remaining_seconds <= 0:
                break  # left as placeholders, unrecorded: nothing was tried
            outcome: _ImageOutcome | None = None
            # trio's own scope too: the model's clock is on trio's timeline, and a describer
            # that ignores its budget must not hold the batch.
            with trio.move_on_after(remaining_seconds):
                outcome = await self._describe_one(media_id, remaining_seconds)
            if outcome is None:
                outcome = _ImageOutcome(None, "budget: the batch's image understanding budget ran out")
            await self.context.storage.write(functools.partial(
                _record_outcome, media_id=media_id, outcome=outcome, now=clock.wall()))
            self.context.trace("image_understood", media=media_id, outcome=outcome.name)
            if outcome.stored_text is not None:
                texts[media_id] = _understood_text(outcome.stored_text)
        return texts

    async def _describe_one(self, media_id: str, budget_seconds: float) -> _ImageOutcome:
        image = await self.context.storage.read(lambda connection: _image_bytes(connection, media_id))
        if image is None:
            return _ImageOutcome(None, "missing: the stored file is gone")
        data, content_type = image
        try:
            text = await self.model.describe_image(data, content_type, budget_seconds=budget_seconds)
        except ModelRefused as refusal:
            return _ImageOutcome(image_refused_text, _error_text(refusal))
        except ModelError as error:
            return _ImageOutcome(None, _error_text(error))
        text = _clip_utf8(str(text).strip(), understanding_text_bytes_max)
        if not text:
            return _ImageOutcome(None, "empty: the model described nothing")
        return _ImageOutcome(text, None)


@dataclass(frozen=True)
class _ImageOutcome:
    """What one image came to: ``stored_text`` completes the media object (a description, or
    the refusal text with ``error`` saying why); ``stored_text=None`` is a failure."""

    stored_text: str | None
    error: str | None

    @property
    def name(self) -> str:
        if self.stored_text is None:
            return "failed"
        return "refused" if self.error else "described"


def _record_outcome(connection: apsw.Connection, *, media_id: str, outcome: _ImageOutcome, now: float) -> None:
    record_media_understanding(connection, media_id, text=outcome.stored_text, error=outcome.error, now=now)


def _error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:image_error_characters_max]


def _clip_utf8(text: str, bytes_max: int) -> str:
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) <= bytes_max:
        return text
    return encoded[:bytes_max].decode("utf-8", "ignore")


def _finish_job(connection: apsw.Connection, batch: ClaimedBatch, state: str, result: dict, reason: str | None,
                now: float, seconds: float, outcome: str) -> None:
    record_model_call(connection, at=now, seconds=seconds, outcome=outcome, purpose="learn", entry_id=batch.entry_id)
    finish_batch(connection, batch.batch_id, state, result, reason, now)
    if outcome != "error":
        state_now = model_state(connection)
        if state_now.get("paused") or outcome == "ok":
            model_state_put(connection, paused=False, reason=None, paused_since=None, last_success_at=now)


_pending_image_prefix = "\x00image:"
"""Marks an image still to be understood, followed by its media id (never shown to a model)."""


def _pending_media_id(text: str) -> str | None:
    return text[len(_pending_image_prefix):] if text.startswith(_pending_image_prefix) else None


def _replace_pending(message: MaterialMessage, texts: dict[str, str]) -> MaterialMessage:
    """The message with each pending image as its understanding, or the placeholder."""
    if not any(text.startswith(_pending_image_prefix) for text in message.media_texts):
        return message
    media_texts = tuple(
        texts.get(media_id, image_placeholder) if (media_id := _pending_media_id(text)) is not None else text
        for text in message.media_texts
    )
    return MaterialMessage(message.id, message.sender, message.content, message.occurred_at,
                           message.quote_author, message.quote_content, media_texts)


def load_material(connection: apsw.Connection, message_ids: Sequence[int]) -> list[MaterialMessage]:
    """The batch's messages in id order, each with its media as text (or the pending marker)."""
    media = _media_texts(connection, message_ids)
    material = []
    for start in range(0, len(message_ids), 500):
        chunk = list(message_ids[start:start + 500])
        marks = ", ".join("?" for _ in chunk)
        for message_id, sender, content, occurred_at, quote_author, quote_content in connection.execute(
            "SELECT id, sender, content, occurred_at, quote_author, quote_content FROM host_messages "
            f"WHERE id IN ({marks}) ORDER BY id", chunk,
        ):
            material.append(MaterialMessage(message_id, sender, content, occurred_at, quote_author, quote_content,
                                            tuple(media.get(message_id, ()))))
    return material


def _media_texts(connection: apsw.Connection, message_ids: Sequence[int]) -> dict[int, list[str]]:
    """Each message's media as text, in position order."""
    texts: dict[int, list[str]] = {}
    for start in range(0, len(message_ids), 500):
        chunk = list(message_ids[start:start + 500])
        marks = ", ".join("?" for _ in chunk)
        rows = connection.execute(
            "SELECT r.message_id, r.media_id, m.content_type, m.understanding_text FROM host_message_media r "
            f"LEFT JOIN host_media m ON m.id = r.media_id WHERE r.message_id IN ({marks}) "
            "ORDER BY r.message_id, r.position", chunk,
        )
        for message_id, media_id, content_type, understanding in rows:
            texts.setdefault(message_id, []).append(_media_text(media_id, content_type, understanding))
    return texts


def _media_text(media_id: str, content_type: str | None, understanding: str | None) -> str:
    """Audio and video are placeholders whatever is stored; an image's stored understanding is
    used as given; an image without one is pending (an unknown object is the placeholder)."""
    kind = (content_type or "image/").split("/", 1)[0]
    if kind == "audio":
        return audio_placeholder
    if kind == "video":
        return video_placeholder
    if understanding and understanding.strip():
        return _understood_text(understanding)
    return _pending_image_prefix + media_id if content_type else image_placeholder


def _understood_text(understanding: str) -> str:
    return f"[图片：{understanding.strip()}]"


def _image_bytes(connection: apsw.Connection, media_id: str) -> tuple[bytes, str] | None:
    """The image's bytes (from the blob store, by SHA-256) and type, or None when gone."""
    media = load_media(connection, media_id)
    if media is None or media.kind != "image":
        return None
    data = blob_get(connection, media.sha256)
    return None if data is None else (data, media.content_type)


def learning_request(material: Sequence[MaterialMessage]) -> CompletionRequest:
    text = "\n".join(message.line() for message in material)[:material_characters_max]
    return CompletionRequest(
        (ChatMessage(role="system", content=_learn_instruction), ChatMessage(role="user", content=text)),
        response_format="json",
        max_output_tokens=4096,
    )


def _learn_sync(model: CpuBoundModel, material: Sequence[MaterialMessage],
                entry_id: str) -> tuple[Completion, list[NewMemory]]:
    """Step 3 for a CpuBoundModel, run by the Env executor: pure, so safe in a worker thread."""
    completion = model.complete_sync(learning_request(material))
    return completion, memories_from(completion.text, material, entry_id)


def memories_from(text: str, material: Sequence[MaterialMessage], entry_id: str) -> list[NewMemory]:
    """The model's answer as memories (either answer shape; anything unreadable is skipped)."""
    try:
        document = json.loads(text)
    except ValueError:
        return []
    if not isinstance(document, dict):
        return []
    items = document.get("memories")
    if not isinstance(items, list):
        items = document.get("facts") if isinstance(document.get("facts"), list) else []
    by_id = {message.id: message for message in material}
    memories: list[NewMemory] = []
    for item in items[:memories_per_batch_max]:
        memory = _memory_of(item, material, by_id, entry_id)
        if memory is not None:
            memories.append(memory)
    return memories


def _memory_of(item: Any, material: Sequence[MaterialMessage], by_id: dict[int, MaterialMessage],
               entry_id: str) -> NewMemory | None:
    if not isinstance(item, dict):
        return None
    raw = item.get("content", item.get("text"))
    if not isinstance(raw, str):
        return None
    sources = [by_id[value] for value in item.get("message_ids", ()) if isinstance(value, int) and value in by_id]
    tagged = _tag.match(raw)
    content = raw[tagged.end():].strip() if tagged else raw.strip()
    if tagged and int(tagged.group(1)) in by_id and not sources:
        sources = [by_id[int(tagged.group(1))]]
    if not content:
        return None
    if not sources:
        sources = [message for message in material if content in message.content] or list(material)
    people = item.get("people")
    if not isinstance(people, list) or not all(isinstance(person, str) for person in people):
        people = list(dict.fromkeys(message.sender for message in sources))
    belief = item.get("belief")
    belief = float(belief) if isinstance(belief, int | float) and 0 <= belief <= 1 else default_belief
    kind = item.get("kind") if isinstance(item.get("kind"), str) else "fact"
    return NewMemory(
        content=content[:32_768],
        kind=local_kinds.get(kind, kind)[:100],
        stance=_text(item.get("stance"), default_stance),
        lifecycle=_text(item.get("lifecycle"), default_lifecycle),
        belief=belief,
        people=people[:100],
        sources=[(entry_id, message.id) for message in sources][:1000],
        occurred_at=_occurred(sources),
        entry_id=entry_id,
    )


def _text(value: Any, default: str) -> str:
    return value[:100] if isinstance(value, str) and value.strip() else default


def _occurred(sources: Sequence[MaterialMessage]) -> datetime.datetime:
    """The latest source's occurred time (with the host's offset)."""
    return max(datetime.datetime.fromisoformat(message.occurred_at) for message in sources)


def learner_actor_kind(*, memory_store_for: Callable[[Any], MemoryStore] | None = None) -> ActorKind:
    """The ``learner`` kind.  ``memory_store_for(context)`` overrides the memory store (tests)."""

    def factory(context: ActorContext) -> LearnerActor:
        store = memory_store_for(context) if memory_store_for is not None else None
        return LearnerActor(context, memory_store=store)

    return ActorKind(
        learner_kind_name,
        factory,
        mailbox_messages_max=64,
        turn_timeout_seconds=learner_turn_timeout_seconds,
    )


__all__ = [
    "LearnerActor",
    "MaterialMessage",
    "MemoryStore",
    "audio_placeholder",
    "host_memory_store",
    "image_placeholder",
    "image_refused_text",
    "image_understanding_budget_seconds",
    "learner_actor_kind",
    "learner_workers_max",
    "learning_request",
    "load_material",
    "memories_from",
    "model_attempts_max",
    "pause_retry_seconds",
    "retry_backoff_seconds",
    "video_placeholder",
]
