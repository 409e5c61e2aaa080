"""Fact extraction, reflection synthesis, the reflection lifecycle and persona corrections.

Why it exists: a companion remembers by distilling — dialogue becomes facts ("主人喜欢寿司"),
related facts become a reflection ("主人爱吃日料"), a reflection that keeps being borne out is
confirmed and finally promoted into the character's long-term persona.  Every step here is a
pure function over state the actor loaded plus, where the contract says so, one call through
the Model port; each returns the *writes to make* (new facts, a new reflection, transitions,
persona writes, each naming its funnel counter), so the actor commits them in ONE store job
together with their funnel events and outbox completion.  Nothing here touches storage, the
clock or ids directly: ``now`` and ``new_id`` are arguments (the Env's, in the actor).

Model tiers (the contract's table; ``ReflectionModels``):

- ``summary``: recent-history compression, fact extraction, reflection synthesis;
- ``correction``: persona corrections and the promotion merge (a reflection folded into an
  existing persona entry);
- ``emotion``: deciding which reflection a negative remark ("不对", "别再提了") targets.

Each tier defaults to the Env's model, and that to ``LocalModel`` (offline, deterministic: it
extracts stated preferences/plans/personal facts and summarises extractively; it cannot judge,
so the emotion tier then falls back to word overlap).  An operator points a tier at an
OpenAI-compatible server with ``CHARACTER_MODEL_<TIER>_BASE_URL``, ``..._NAME`` and
``..._API_KEY`` (``<TIER>`` = ``SUMMARY``, ``CORRECTION``, ``EMOTION``); memory code never names a
provider model.  A model error propagates (``troupe.models.ModelError``): the caller is a
background task of the outbox, which retries it a bounded number of times.

Lifecycle of a reflection (``plan_lifecycle``), each arrow a funnel counter:

    pending --(a newer fact supports it)--> confirmed --(confirmed long enough)--> promoted
       |                                                                  (or merged into an
       |--(denied by the user)--> denied --(later)--> archived             existing persona
       '--(no support before it expires)--> archived                       entry: merged)
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from troupe.models import CompletionRequest, LocalModel, ModelResponseInvalid, user_request

from ._context import history_summary_meta_key
from ._store import NewFact, NewReflection

# -- limits --------------------------------------------------------------------------------

facts_per_extraction_max = 32
"""New facts one extraction may add."""
fact_text_characters_max = 500
"""A longer extracted sentence is cut (facts are one statement)."""
dialogue_characters_max = 20_000
"""Dialogue text handed to the model per extraction (the newest part is kept)."""
reflection_facts_min = 3
"""Unreflected facts about one entity needed before a reflection is synthesised."""
reflection_facts_max = 12
"""Facts folded into one reflection."""
reflection_text_characters_max = 1_000
persona_entry_characters_max = 2_000
similarity_merge_min = 0.5
"""Overlap at which a promoted reflection is merged into an existing persona entry."""
similarity_support_min = 0.25
"""Overlap at which a newer fact supports (confirms) a pending reflection, or a negative
remark targets a reflection."""
model_output_tokens_max = 1_024

assert reflection_facts_min <= reflection_facts_max
assert 0.0 < similarity_support_min <= similarity_merge_min <= 1.0

model_tiers: tuple[str, ...] = ("summary", "correction", "emotion")
ModelTier = Literal["summary", "correction", "emotion"]
environment_prefix = "CHARACTER_MODEL_"

FunnelKind = Literal[
    "facts_added",
    "reflections_synthesized",
    "reflections_confirmed",
    "reflections_promoted",
    "reflections_merged",
    "reflections_denied",
    "reflections_archived",
    "persona_entries_added",
    "persona_entries_rewritten",
    "persona_entries_archived",
]

NewId = Callable[[str], str]
"""``env.ids.new_id``: ``new_id("fact_")`` → ``"fact_..."``."""


@dataclass(frozen=True)
class LifecycleSettings:
    """Ages of the reflection lifecycle, in seconds."""

    pending_expiry_seconds: float = 14 * 24 * 3600.0
    """A pending reflection no newer fact supported by then is archived."""
    promote_after_seconds: float = 3 * 24 * 3600.0
    """A confirmed reflection is promoted this long after its confirmation."""
    denied_archive_after_seconds: float = 24 * 3600.0
    """A denied reflection moves to the archive this long after the denial."""

    def __post_init__(self) -> None:
        assert min(self.pending_expiry_seconds, self.promote_after_seconds) > 0
        assert self.denied_archive_after_seconds >= 0


# -- models -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReflectionModels:
    """The model of each tier (see the module docstring)."""

    summary: Any
    correction: Any
    emotion: Any

    @classmethod
    def single(cls, model: Any = None) -> ReflectionModels:
        """Every tier on one model (``LocalModel`` when ``None``)."""
        model = model if model is not None else LocalModel()
        return cls(summary=model, correction=model, emotion=model)

    def tier(self, name: ModelTier) -> Any:
        return getattr(self, name)


def reflection_models_from_environment(
    environ: Mapping[str, str], *, default: Any = None, **options: Any
) -> ReflectionModels:
    """Each tier from ``CHARACTER_MODEL_<TIER>_BASE_URL`` / ``_NAME`` / ``_API_KEY`` when its
    base URL is set, else ``default`` (the Env's model), else ``LocalModel``.  ``options``
    go to ``OpenAIChatModel`` (client, clock, random)."""
    from troupe.models import ModelConfigurationError, model_by_name

    fallback = default if default is not None else LocalModel()
    chosen: dict[str, Any] = {}
    for tier in model_tiers:
        prefix = f"{environment_prefix}{tier.upper()}_"
        base_url = environ.get(prefix + "BASE_URL", "").strip()
        if not base_url:
            chosen[tier] = fallback
            continue
        name = environ.get(prefix + "NAME", "").strip()
        if not name:
            raise ModelConfigurationError(f"{prefix}BASE_URL is set but {prefix}NAME is not")
        api_key = environ.get(prefix + "API_KEY", "").strip() or None
        chosen[tier] = model_by_name("openai", base_url=base_url, api_key=api_key, model=name, **options)
    return ReflectionModels(**chosen)


def _can(model: Any, capability: str) -> bool:
    return capability in getattr(model, "capabilities", frozenset()) and hasattr(model, capability)


def _converses(model: Any) -> bool:
    """A model that can follow instructions (not the rule-based local one)."""
    capabilities = getattr(model, "capabilities", None)
    return capabilities is None or "converse" in capabilities


# -- text helpers ----------------------------------------------------------------------------

_cjk = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_word = re.compile(rf"[^\W_{_cjk}]+")
_cjk_run = re.compile(rf"[{_cjk}]+")


def normalised_text(text: str) -> str:
    """Case-folded, NFKC, punctuation and spaces removed: the key facts are deduplicated by."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return "".join(character for character in folded if character.isalnum())


@functools.lru_cache(maxsize=4096)
def text_features(text: str) -> frozenset[str]:
    """Words and Chinese character pairs (single characters for one-character runs).
    Cached: a lifecycle pass compares every candidate fact with every reflection."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    features = {word for word in _word.findall(folded) if not _cjk_run.fullmatch(word)}
    for run in _cjk_run.findall(folded):
        if len(run) == 1:
            features.add(run)
        features.update(run[index : index + 2] for index in range(len(run) - 1))
    return frozenset(features)


def similarity(first: str, second: str) -> float:
    """Overlap of two texts' features relative to the smaller one, 0..1."""
    left, right = text_features(first), text_features(second)
    if not left or not right:
        return 0.0
    return len(left & right) / min(len(left), len(right))


def _cut(text: str, characters_max: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= characters_max else text[: characters_max - 1] + "…"


# -- shapes of loaded state (the store's rows fit these) ---------------------------------------


@dataclass(frozen=True)
class DialogueLine:
    """One message of cached dialogue: role, its text and when it was said (wall seconds)."""

    role: str
    text: str
    at: float


class FactView(Protocol):
    id: str
    text: str
    entity: str
    created_at: float
    event_start_at: float | None


class ReflectionView(Protocol):
    id: str
    text: str
    entity: str
    status: str
    created_at: float
    updated_at: float
    confirmed_at: float | None
    source_fact_ids: Sequence[str]


class PersonaEntryView(Protocol):
    id: str
    section: str
    text: str
    status: str
    revision: int


# -- writes ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FactExtraction:
    """``facts`` to add with ``_store.add_facts`` (which logs ``facts_added``)."""

    facts: tuple[NewFact, ...]
    duplicates_skipped: int = 0
    lines_covered: int | None = None
    """How many leading lines every found fact of was taken (``None``: all of them); short
    when ``facts_per_extraction_max`` cut the extraction, so the caller's cursor can stop
    there and the rest be extracted by the next task."""


def reflection_summary(reflection: NewReflection) -> dict[str, Any]:
    """The ``reflection`` member of ``/reflect``'s answer for a just-synthesised one."""
    return {
        "id": reflection.id,
        "text": reflection.text,
        "entity": reflection.entity,
        "status": "pending",
        "source_fact_ids": list(reflection.source_fact_ids),
        "event_start_at": reflection.event_start_at,
        "event_end_at": reflection.event_end_at,
    }


@dataclass(frozen=True)
class ReflectionTransition:
    """Move reflection ``reflection_id`` from ``from_status`` to ``to_status`` at ``at``."""

    reflection_id: str
    from_status: str
    to_status: Literal["confirmed", "promoted", "merged", "denied", "archived"]
    at: float
    merged_into: str | None = None
    """For ``merged``: the persona entry it was folded into."""

    @property
    def funnel_kind(self) -> FunnelKind:
        return {  # type: ignore[return-value]
            "confirmed": "reflections_confirmed",
            "promoted": "reflections_promoted",
            "merged": "reflections_merged",
            "denied": "reflections_denied",
            "archived": "reflections_archived",
        }[self.to_status]


@dataclass(frozen=True)
class PersonaWrite:
    """Add, rewrite or archive one persona entry (``revision`` is the new revision)."""

    action: Literal["add", "rewrite", "archive"]
    entry_id: str
    section: str
    text: str
    source: str
    revision: int
    at: float

    @property
    def funnel_kind(self) -> FunnelKind:
        return {  # type: ignore[return-value]
            "add": "persona_entries_added",
            "rewrite": "persona_entries_rewritten",
            "archive": "persona_entries_archived",
        }[self.action]


@dataclass(frozen=True)
class LifecyclePlan:
    """Everything one lifecycle pass changes; commit it in one job with one funnel event
    per transition and per persona write (``funnel_counts`` sums them)."""

    transitions: tuple[ReflectionTransition, ...] = ()
    persona_writes: tuple[PersonaWrite, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not self.transitions and not self.persona_writes

    def funnel_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for change in (*self.transitions, *self.persona_writes):
            counts[change.funnel_kind] = counts.get(change.funnel_kind, 0) + 1
        return counts


@dataclass(frozen=True)
class CorrectionProposal:
    """A proposed correction of a persona entry (``entry_id`` None: a new entry)."""

    entry_id: str | None
    section: str
    proposed_text: str
    reason: str = field(default="")


@dataclass(frozen=True)
class HistoryCompression:
    """Recent history compressed: ``summary`` of the older messages plus the newest kept."""

    summary: str
    kept: tuple[DialogueLine, ...]
    compressed_count: int

    def metadata(self, *, now: float) -> dict[str, Any]:
        """The recent-history metadata to store with ``_store.fold_recent_prefix`` (what
        ``_context`` renders as the earlier-conversation summary)."""
        return {history_summary_meta_key: self.summary, "compressed_count": self.compressed_count,
                "compressed_at": now}


# -- completions -------------------------------------------------------------------------------


async def _complete_text(model: Any, system: str, text: str) -> str:
    request = user_request(text, system=system, max_output_tokens=model_output_tokens_max)
    completion = await model.complete(request)
    return completion.text.strip()


async def _complete_json(model: Any, system: str, text: str) -> dict[str, Any]:
    request = CompletionRequest(
        messages=user_request(text, system=system).messages,
        max_output_tokens=model_output_tokens_max,
        response_format="json",
    )
    completion = await model.complete(request)
    try:
        value = json.loads(completion.text)
    except ValueError as exc:
        raise ModelResponseInvalid("the model's answer is not JSON") from exc
    if not isinstance(value, dict):
        raise ModelResponseInvalid("the model's answer is not a JSON object")
    return value


async def summarise_text(model: Any, text: str) -> str:
    """``text`` summarised by ``model`` (the local model's extractive summary, or a
    completion asking for one)."""
    if _can(model, "summarise"):
        return model.summarise(text)
    return await _complete_text(model, "请用一两句话总结下面的内容（摘要），不要添加新信息。", text)


# -- fact extraction ----------------------------------------------------------------------------


def entity_of(role: str, character_name: str) -> str | None:
    """Whom a statement is about: the user is ``master``, the assistant the character;
    system lines carry no facts."""
    if role == "user":
        return "master"
    if role == "assistant":
        return character_name
    return None


async def extract_dialogue_facts(
    models: ReflectionModels,
    lines: Sequence[DialogueLine],
    *,
    character_name: str,
    known_fact_texts: Iterable[str],
    new_id: NewId,
) -> FactExtraction:
    """Facts stated in ``lines`` (summary tier), minus those already known (normalised
    text).  Each fact's ``event_start_at`` is when its line was said."""
    found = await find_dialogue_facts(models, lines, character_name=character_name)
    return new_dialogue_facts(found, known_fact_texts, new_id=new_id)


FoundFact = tuple[str, str, float, int]
"""A fact the model found in a line: (entity, text, when the line was said, the line's
index in the extraction's lines)."""


async def find_dialogue_facts(
    models: ReflectionModels, lines: Sequence[DialogueLine], *, character_name: str
) -> list[FoundFact]:
    """The facts the model finds in ``lines`` (summary tier), before deduplication: the
    post-turn task asks this first and reads the known facts only when something was found
    (most turns state no fact)."""
    model = models.summary
    if not _can(model, "extract_facts"):
        return await _extract_with_completion(model, lines, character_name)
    found: list[FoundFact] = []
    for index, line in enumerate(lines):
        entity = entity_of(line.role, character_name)
        if entity is not None and line.text.strip():
            found.extend((entity, fact.text, line.at, index) for fact in model.extract_facts(line.text))
    return found


def new_dialogue_facts(found: Iterable[FoundFact], known_fact_texts: Iterable[str], *,
                       new_id: NewId) -> FactExtraction:
    """The found facts not already known (normalised text, also among themselves), cut to
    ``fact_text_characters_max`` and at most ``facts_per_extraction_max`` of them."""
    seen = {normalised_text(text) for text in known_fact_texts}
    facts: list[NewFact] = []
    duplicates = 0
    lines_covered = None
    for entity, text, at, line_index in found:
        text = _cut(text, fact_text_characters_max)
        key = normalised_text(text)
        if not key or key in seen:
            duplicates += 1
            continue
        if len(facts) >= facts_per_extraction_max:
            lines_covered = line_index
            break
        seen.add(key)
        facts.append(NewFact(id=new_id("fact_"), text=text, entity=entity, event_start_at=at))
    return FactExtraction(tuple(facts), duplicates, lines_covered)


async def _extract_with_completion(
    model: Any, lines: Sequence[DialogueLine], character_name: str
) -> list[FoundFact]:
    numbered = []
    for index, line in enumerate(lines):
        if entity_of(line.role, character_name) is not None:
            numbered.append(f"[{index}] {line.role}: {line.text}")
    if not numbered:
        return []
    dialogue = "\n".join(numbered)[-dialogue_characters_max:]
    answer = await _complete_json(
        model,
        "从对话中提取关于用户（master）或角色自身的长期事实（偏好、计划、个人信息）。"
        '只输出 JSON：{"facts": [{"line": 行号, "entity": "master" 或角色名, "text": "事实"}]}。',
        dialogue,
    )
    found = []
    for item in answer.get("facts") or []:
        if not isinstance(item, dict) or not isinstance(item.get("text"), str):
            continue
        line_index = item.get("line")
        line = lines[line_index] if isinstance(line_index, int) and 0 <= line_index < len(lines) else None
        # Only the two entities a dialogue can state facts about (a model's free text could
        # name anything, of any length).
        entity = item.get("entity") if item.get("entity") in ("master", character_name) else None
        if line is not None:
            entity = entity or entity_of(line.role, character_name)
        at = line.at if line is not None else (lines[-1].at if lines else 0.0)
        index = line_index if line is not None else len(lines) - 1
        found.append((entity or "master", item["text"], at, index))
    # In line order, so a cut at ``facts_per_extraction_max`` leaves whole lines for later.
    return sorted(found, key=lambda fact: fact[3])


# -- reflection synthesis ---------------------------------------------------------------------


def unreflected_facts(facts: Sequence[FactView], reflections: Iterable[ReflectionView]) -> list[FactView]:
    """Active facts no reflection (of any status) was synthesised from yet."""
    used = {fact_id for reflection in reflections for fact_id in reflection.source_fact_ids}
    return [fact for fact in facts if fact.id not in used]


async def synthesise_reflection(
    models: ReflectionModels,
    facts: Sequence[FactView],
    *,
    new_id: NewId,
) -> NewReflection | None:
    """One pending reflection over the entity with the most unreflected ``facts`` (at least
    ``reflection_facts_min``, at most ``reflection_facts_max``, oldest first), written by the
    summary tier; ``None`` when no entity has enough."""
    by_entity: dict[str, list[FactView]] = {}
    for fact in facts:
        by_entity.setdefault(fact.entity, []).append(fact)
    candidates = [group for group in by_entity.values() if len(group) >= reflection_facts_min]
    if not candidates:
        return None
    group = max(candidates, key=lambda group: (len(group), -min(fact.created_at for fact in group)))
    chosen = sorted(group, key=lambda fact: (fact.created_at, fact.id))[:reflection_facts_max]
    joined = "\n".join(fact.text.strip() for fact in chosen)
    text = _cut(await summarise_text(models.summary, joined), reflection_text_characters_max)
    if not text:
        return None
    times = [fact.event_start_at if fact.event_start_at is not None else fact.created_at for fact in chosen]
    return NewReflection(
        id=new_id("reflection_"),
        text=text,
        entity=chosen[0].entity,
        event_start_at=min(times),
        event_end_at=max(times) if max(times) != min(times) else None,
        source_fact_ids=tuple(fact.id for fact in chosen),
    )


# -- lifecycle --------------------------------------------------------------------------------


async def plan_lifecycle(
    models: ReflectionModels,
    reflections: Sequence[ReflectionView],
    facts: Sequence[FactView],
    persona_entries: Sequence[PersonaEntryView],
    *,
    now: float,
    new_id: NewId,
    settings: LifecycleSettings = LifecycleSettings(),
) -> LifecyclePlan:
    """One pass of the lifecycle over the character's reflections (see the module
    docstring): confirm the supported, promote (or merge) the long-confirmed, archive the
    expired and the long-denied.  ``facts`` are the active facts."""
    transitions: list[ReflectionTransition] = []
    writes: list[PersonaWrite] = []
    entries = [entry for entry in persona_entries if entry.status == "active"]
    rewritten: dict[str, PersonaWrite] = {}
    for reflection in sorted(reflections, key=lambda reflection: (reflection.created_at, reflection.id)):
        status = reflection.status
        if status == "pending":
            if _supported(reflection, facts):
                transitions.append(ReflectionTransition(reflection.id, status, "confirmed", now))
            elif now - reflection.created_at >= settings.pending_expiry_seconds:
                transitions.append(ReflectionTransition(reflection.id, status, "archived", now))
        elif status == "confirmed":
            confirmed_at = reflection.confirmed_at if reflection.confirmed_at is not None else reflection.updated_at
            if now - confirmed_at < settings.promote_after_seconds:
                continue
            transition, write = await _promote(models, reflection, entries, rewritten, now=now, new_id=new_id)
            transitions.append(transition)
            writes.append(write)
            if write.action == "add":
                entries.append(_EntrySnapshot(write.entry_id, write.section, write.text, "active", write.revision))
            else:
                rewritten[write.entry_id] = write
        elif status == "denied" and now - reflection.updated_at >= settings.denied_archive_after_seconds:
            transitions.append(ReflectionTransition(reflection.id, status, "archived", now))
    # One rewrite per entry: keep the last text of each rewritten entry.
    final_writes: list[PersonaWrite] = []
    for write in writes:
        if write.action == "rewrite" and rewritten.get(write.entry_id) is not write:
            continue
        final_writes.append(write)
    return LifecyclePlan(tuple(transitions), tuple(final_writes))


@dataclass(frozen=True)
class _EntrySnapshot:
    id: str
    section: str
    text: str
    status: str
    revision: int


def _supported(reflection: ReflectionView, facts: Sequence[FactView]) -> bool:
    """A fact newer than the reflection, not one of its sources, that says the same thing as
    the reflection or as one of its source facts."""
    sources = set(reflection.source_fact_ids)
    claims = [reflection.text, *(fact.text for fact in facts if fact.id in sources)]
    return any(
        fact.created_at > reflection.created_at
        and fact.id not in sources
        and any(similarity(fact.text, claim) >= similarity_support_min for claim in claims)
        for fact in facts
    )


async def _promote(
    models: ReflectionModels,
    reflection: ReflectionView,
    entries: Sequence[PersonaEntryView],
    rewritten: Mapping[str, PersonaWrite],
    *,
    now: float,
    new_id: NewId,
) -> tuple[ReflectionTransition, PersonaWrite]:
    """Promotes into a new persona entry, or merges into the most similar one (correction
    tier) when the overlap reaches ``similarity_merge_min``."""
    best, best_similarity = None, 0.0
    for entry in entries:
        if entry.section != reflection.entity:
            continue
        text = rewritten[entry.id].text if entry.id in rewritten else entry.text
        score = similarity(text, reflection.text)
        if score > best_similarity:
            best, best_similarity = entry, score
    if best is None or best_similarity < similarity_merge_min:
        entry_id = new_id("persona_")
        write = PersonaWrite("add", entry_id, reflection.entity,
                             _cut(reflection.text, persona_entry_characters_max), "reflection", 1, now)
        return ReflectionTransition(reflection.id, reflection.status, "promoted", now), write
    previous = rewritten.get(best.id)
    current_text = previous.text if previous is not None else best.text
    revision = (previous.revision if previous is not None else best.revision) + 1
    merged = _cut(await merge_texts(models.correction, current_text, reflection.text), persona_entry_characters_max)
    write = PersonaWrite("rewrite", best.id, best.section, merged, "reflection", revision, now)
    return ReflectionTransition(reflection.id, reflection.status, "merged", now, merged_into=best.id), write


async def merge_texts(model: Any, existing: str, addition: str) -> str:
    """``existing`` with ``addition`` folded in.  A conversing model rewrites both into one
    statement; the local model keeps the existing text and appends what it does not
    already contain."""
    if _converses(model):
        merged = await _complete_text(
            model,
            "把两条关于同一对象的描述合并成一条简洁、不重复的描述。只输出合并后的描述。",
            f"已有：{existing}\n新增：{addition}",
        )
        if merged:
            return merged
    if normalised_text(addition) in normalised_text(existing):
        return existing
    separator = "" if existing.endswith(("。", "！", "？", "；", ".", "!", "?")) else "；"
    return f"{existing}{separator}{addition}"


# -- denial and correction ----------------------------------------------------------------------

_negative = re.compile(
    r"不对|不是的|不是这样|错了|才不|别再提|不要再提|别提了|没有的事|胡说|瞎说|不喜欢了|不再"
    r"|\bnot true\b|\bwrong\b|\bno longer\b|\bstop (?:saying|bringing)\b",
    re.IGNORECASE,
)


def is_negative_remark(text: str) -> bool:
    return bool(_negative.search(text))


async def detect_denials(
    models: ReflectionModels,
    lines: Sequence[DialogueLine],
    reflections: Sequence[ReflectionView],
    *,
    now: float,
) -> tuple[ReflectionTransition, ...]:
    """Pending/confirmed reflections a user's negative remark in ``lines`` targets (emotion
    tier: a conversing model names the target; otherwise the most similar reflection with at
    least ``similarity_support_min`` overlap)."""
    active = [reflection for reflection in reflections if reflection.status in ("pending", "confirmed")]
    if not active:
        return ()
    denied: dict[str, ReflectionTransition] = {}
    for line in lines:
        if line.role != "user" or not is_negative_remark(line.text):
            continue
        target = await _denial_target(models.emotion, line.text, active)
        if target is not None and target.id not in denied:
            denied[target.id] = ReflectionTransition(target.id, target.status, "denied", now)
    return tuple(denied.values())


async def _denial_target(model: Any, remark: str, active: Sequence[ReflectionView]) -> ReflectionView | None:
    if _converses(model):
        listing = "\n".join(f"{reflection.id}: {reflection.text}" for reflection in active)
        answer = await _complete_json(
            model,
            '判断用户的否定针对哪一条记忆。只输出 JSON：{"target": 记忆 id 或 null}。',
            f"用户：{remark}\n记忆：\n{listing}",
        )
        target_id = answer.get("target")
        return next((reflection for reflection in active if reflection.id == target_id), None)
    best, best_similarity = None, 0.0
    for reflection in active:
        score = similarity(remark, reflection.text)
        if score > best_similarity:
            best, best_similarity = reflection, score
    return best if best_similarity >= similarity_support_min else None


_correction_statement = re.compile(r"其实|现在|已经|不再|不喜欢了|改成|\bactually\b|\bnow\b|\bno longer\b", re.IGNORECASE)


async def propose_correction(
    models: ReflectionModels,
    entries: Sequence[PersonaEntryView],
    statement: str,
) -> CorrectionProposal | None:
    """A correction of the persona from a trusted statement ("其实我现在不喜欢寿司了"):
    the most similar active entry rewritten by the correction tier (the local model replaces
    the entry's text with the statement), or ``None`` when no entry is concerned."""
    active = [entry for entry in entries if entry.status == "active"]
    best, best_similarity = None, 0.0
    for entry in active:
        score = similarity(statement, entry.text)
        if score > best_similarity:
            best, best_similarity = entry, score
    if best is None or best_similarity < similarity_support_min or not _correction_statement.search(statement):
        return None
    model = models.correction
    if _converses(model):
        text = await _complete_text(
            model,
            "根据用户的更正改写这条人设描述。只输出改写后的描述。",
            f"描述：{best.text}\n更正：{statement}",
        )
    else:
        text = statement.strip()
    text = _cut(text, persona_entry_characters_max)
    return CorrectionProposal(best.id, best.section, text, reason=statement) if text else None


def apply_correction(entry: PersonaEntryView, correction: CorrectionProposal, *, now: float) -> PersonaWrite:
    """The persona write of an accepted correction (``persona_entries_rewritten``)."""
    assert correction.entry_id == entry.id
    return PersonaWrite("rewrite", entry.id, entry.section, correction.proposed_text, "correction",
                        entry.revision + 1, now)


# -- recent history compression -------------------------------------------------------------------

recent_history_kept_messages = 10
"""Messages kept verbatim by an ordinary compression (``/process``)."""
recent_history_kept_messages_detailed = 20
"""Messages kept verbatim by the detailed compression (``/renew``, ``/settle``)."""
compression_threshold_messages = 40
"""Beyond this many messages, recent history is compressed."""
history_summary_characters_max = 2_000

assert recent_history_kept_messages <= recent_history_kept_messages_detailed < compression_threshold_messages


async def compress_history(
    models: ReflectionModels,
    lines: Sequence[DialogueLine],
    *,
    previous_summary: str,
    detailed: bool,
) -> HistoryCompression | None:
    """Folds the older part of recent history into its summary (summary tier) once it has
    more than ``compression_threshold_messages`` messages (``detailed``: whenever anything
    beyond the kept tail exists); ``None`` when there is nothing to compress."""
    keep = recent_history_kept_messages_detailed if detailed else recent_history_kept_messages
    if len(lines) <= keep or (not detailed and len(lines) <= compression_threshold_messages):
        return None
    older, kept = lines[:-keep], lines[-keep:]
    text = "\n".join(f"{line.role}: {line.text}" for line in older if line.text.strip())
    if previous_summary:
        text = f"{previous_summary}\n{text}"
    summary = _cut(await summarise_text(models.summary, text[-dialogue_characters_max:]), history_summary_characters_max)
    return HistoryCompression(summary, tuple(kept), len(older))


__all__ = [
    "DialogueLine",
    "FactExtraction",
    "FoundFact",
    "FactView",
    "HistoryCompression",
    "LifecyclePlan",
    "LifecycleSettings",
    "ModelTier",
    "CorrectionProposal",
    "PersonaEntryView",
    "PersonaWrite",
    "ReflectionModels",
    "ReflectionTransition",
    "ReflectionView",
    "apply_correction",
    "compress_history",
    "detect_denials",
    "entity_of",
    "extract_dialogue_facts",
    "find_dialogue_facts",
    "new_dialogue_facts",
    "fact_text_characters_max",
    "facts_per_extraction_max",
    "is_negative_remark",
    "merge_texts",
    "model_tiers",
    "normalised_text",
    "plan_lifecycle",
    "propose_correction",
    "recent_history_kept_messages",
    "recent_history_kept_messages_detailed",
    "compression_threshold_messages",
    "reflection_summary",
    "reflection_facts_max",
    "reflection_facts_min",
    "reflection_models_from_environment",
    "similarity",
    "summarise_text",
    "synthesise_reflection",
    "unreflected_facts",
]
