"""The embedded default Model: deterministic, offline, rule-based, and honest about it.

Why it exists: a fresh install with no network must still learn from conversations (pull out
stated preferences and plans, summarise a session), and the simulator needs a model whose
output is a pure function of its input.  A rule-based model does both in microseconds.

What it trades off: it understands nothing.  It does exactly three things, listed in
``capabilities``, and nothing else:

- ``extract_facts``: sentences in which the speaker states a preference ("I like…", "我喜欢…"),
  a plan ("I'm going to…", "我打算…") or a fact about themselves ("I live in…", "我住在…"),
  matched by fixed English and Chinese patterns; questions are skipped.
- ``summarise``: picks the most central sentences (by shared words and Chinese character
  pairs) and returns them in their original order.  Extractive only; it never paraphrases.
- ``json_object``: in JSON mode it answers ``{"facts": [{"kind", "text"}...], "summary": "..."}``
  for the last user message: always valid JSON, never any other key.

It never calls tools (tools in a request are ignored and ``tool_calls`` is always empty), never
converses: a text request that asks for neither facts nor a summary gets ``unsupported_reply``.
It cannot see: it has no ``describe_image`` and does not list it, so callers that understand
images (learning) use their fallback text (``[图片，未理解]``) rather than pretend.
Callers check ``capabilities`` (e.g. ``"converse" not in model.capabilities``) rather than
parse its output.  It is a ``CpuBoundModel``: ``complete_sync`` is the same answer without the
event loop, a pure function of the request (nothing mutable is shared: the patterns are
compiled once and only read), so callers may run it in a worker thread; a 100-message learning
batch costs milliseconds of regex and summary work.  Token counts in ``usage`` are estimates
(one per CJK character, one per word or punctuation mark).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass

import trio

from ._messages import Completion, CompletionChunk, CompletionRequest, Usage

local_model_name = "local"
summary_sentences_max_default = 3
facts_max = 64
input_chars_max = 200_000

unsupported_reply = (
    "The local model cannot hold a conversation. It can extract stated facts and summarise "
    "text; configure an OpenAI-compatible model (TROUPE_MODEL_BASE_URL) for more."
)

_cjk = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_sentence_end = re.compile(r"(?<=[。！？!?；;…])\s*|(?<=[.])\s+|\n+")
_token_pattern = re.compile(rf"[{_cjk}]|[^\W_{_cjk}]+|[^\w\s]")
_word_pattern = re.compile(rf"[^\W_{_cjk}]+")
_cjk_run_pattern = re.compile(rf"[{_cjk}]+")
_stop_words = frozenset(
    """a an and are as at be but by for from had has have he her his i if in is it its me my
    of on or our she so that the their them then there they this to was we were what when
    which who will with you your""".split()
)

_fact_patterns: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "preference",
        re.compile(
            r"\bI\s+(?:really\s+|also\s+|just\s+|still\s+|absolutely\s+)?"
            r"(?:like|love|enjoy|prefer|adore|hate|dislike|can't stand|cannot stand)\b"
            r"|\bI\s+(?:don't|do not|never)\s+(?:like|enjoy|eat|drink)\b"
            r"|\bmy\s+favou?rite\b|\bI(?:'m|\s+am)\s+(?:a\s+(?:big\s+|huge\s+)?fan of|into)\b",
            re.IGNORECASE,
        ),
    ),
    (
        "preference",
        re.compile(
            r"我(?:很|真|也|最|特别|非常|超|还|一直|不|不太)?(?:喜欢|爱吃|爱喝|爱看|爱玩|喜爱|讨厌|偏爱|热爱|受不了)|我最爱|我的最爱"
        ),
    ),
    (
        "plan",
        re.compile(
            r"\bI(?:'m|\s+am)\s+(?:going to|planning to|planning on|gonna|about to|thinking of)\b"
            r"|\bI\s+(?:plan|intend|want|hope|need|decided)\s+to\b|\bI(?:'ll|\s+will)\b"
            r"|\bmy\s+plan\b",
            re.IGNORECASE,
        ),
    ),
    (
        "plan",
        re.compile(
            r"我(?:打算|计划|准备|想要|将要|决定|要去|会去)|我(?:明天|下周|下个月|明年|周末)"
        ),
    ),
    (
        "personal",
        re.compile(
            r"\bI\s+(?:live|grew up|was born)\s+in\b|\bI\s+work\s+(?:at|as|for|in)\b"
            r"|\bI(?:'m|\s+am)\s+(?:allergic to|a|an)\s+\w+|\bI\s+have\s+(?:a|two|three)\s+\w+"
            r"|\bmy\s+(?:name|birthday|job|wife|husband|partner|son|daughter|dog|cat)\b",
            re.IGNORECASE,
        ),
    ),
    (
        "personal",
        re.compile(
            r"我(?:住在|在.{1,12}工作|是一?[名个位]|叫|的名字|的生日|对.{1,12}过敏|养了|有一?[个只条])"
        ),
    ),
)
_question = re.compile(
    r"[?？]\s*$|^(?:do|does|did|what|why|how|where|when|who|are|is|can)\b", re.IGNORECASE
)

_fact_instruction = re.compile(r"extract|\bfacts?\b|remember|提取|事实|记住|记忆", re.IGNORECASE)
_summary_instruction = re.compile(r"summar|摘要|总结|概括", re.IGNORECASE)


@dataclass(frozen=True)
class Fact:
    """A sentence in which the speaker states something about themselves."""

    kind: str  # "preference", "plan" or "personal"
    text: str

    def encode(self) -> dict[str, str]:
        return {"kind": self.kind, "text": self.text}


def split_sentences(text: str) -> list[str]:
    return [sentence.strip() for sentence in _sentence_end.split(text) if sentence.strip()]


def estimate_tokens(text: str) -> int:
    return len(_token_pattern.findall(text))


def extract_facts(text: str) -> list[Fact]:
    """Sentences of ``text`` that state a preference, plan or personal fact, in order."""
    facts: list[Fact] = []
    seen: set[str] = set()
    for sentence in split_sentences(text[:input_chars_max]):
        if _question.search(sentence) or sentence in seen:
            continue
        kind = next((kind for kind, pattern in _fact_patterns if pattern.search(sentence)), None)
        if kind is not None:
            seen.add(sentence)
            facts.append(Fact(kind, sentence))
        if len(facts) >= facts_max:
            break
    return facts


def summarise(text: str, sentences_max: int = summary_sentences_max_default) -> str:
    """The ``sentences_max`` most central sentences of ``text``, in their original order."""
    assert sentences_max > 0, sentences_max
    sentences = split_sentences(text[:input_chars_max])
    if len(sentences) <= sentences_max:
        return _join(sentences)
    features = [_features(sentence) for sentence in sentences]
    frequency = Counter(feature for sentence in features for feature in set(sentence))

    def centrality(index: int) -> float:
        own = features[index]
        if not own:
            return 0.0
        return sum(frequency[feature] - 1 for feature in own) / len(own) ** 0.5

    ranked = sorted(range(len(sentences)), key=lambda index: (-centrality(index), index))
    chosen = sorted(ranked[:sentences_max])
    return _join([sentences[index] for index in chosen])


def _join(sentences: list[str]) -> str:
    """Chinese sentences end in their own punctuation and take no space after it."""
    text = ""
    for sentence in sentences:
        separator = "" if not text or text[-1] in "。！？；…" else " "
        text += separator + sentence
    return text


def _features(sentence: str) -> list[str]:
    words = [word.lower() for word in _word_pattern.findall(sentence)]
    features = [word for word in words if word not in _stop_words and len(word) > 1]
    for run in _cjk_run_pattern.findall(sentence):
        features.extend(run[start : start + 2] for start in range(len(run) - 1))
    return features


class LocalModel:
    """The offline ``Model``: see the module docstring for exactly what it does."""

    name = local_model_name
    capabilities = frozenset({"extract_facts", "summarise", "json_object", "stream"})

    def __init__(self, *, summary_sentences_max: int = summary_sentences_max_default) -> None:
        assert summary_sentences_max > 0, summary_sentences_max
        self._summary_sentences_max = summary_sentences_max

    def extract_facts(self, text: str) -> list[Fact]:
        return extract_facts(text)

    def summarise(self, text: str) -> str:
        return summarise(text, self._summary_sentences_max)

    async def complete(self, request: CompletionRequest) -> Completion:
        await trio.lowlevel.checkpoint()
        return self._answer(request)

    def complete_sync(self, request: CompletionRequest) -> Completion:
        """``complete`` without the event loop (``CpuBoundModel``): safe in a worker thread."""
        return self._answer(request)

    async def stream(self, request: CompletionRequest) -> AsyncIterator[CompletionChunk]:
        completion = self._answer(request)
        for piece in _pieces(completion.text):
            await trio.lowlevel.checkpoint()
            yield CompletionChunk(text_delta=piece)
        await trio.lowlevel.checkpoint()
        yield CompletionChunk(finish_reason=completion.finish_reason, usage=completion.usage)

    def _answer(self, request: CompletionRequest) -> Completion:
        source = _last_user_text(request)
        if request.response_format == "json":
            text, finish_reason = self._json_answer(source, request.max_output_tokens)
        else:
            text, finish_reason = _truncate(
                self._text_answer(request, source), request.max_output_tokens
            )
        prompt_tokens = sum(estimate_tokens(message.content) for message in request.messages)
        return Completion(
            text=text,
            finish_reason=finish_reason,
            usage=Usage(prompt_tokens, estimate_tokens(text)),
        )

    def _text_answer(self, request: CompletionRequest, source: str) -> str:
        instructions = " ".join(
            message.content for message in request.messages if message.role == "system"
        )
        instructions = f"{instructions} {source[:500]}"
        if _fact_instruction.search(instructions):
            return "\n".join(f"- {fact.text}" for fact in self.extract_facts(source))
        if _summary_instruction.search(instructions):
            return self.summarise(source)
        return unsupported_reply

    def _json_answer(self, source: str, tokens_max: int) -> tuple[str, str]:
        """Always valid JSON: facts are dropped from the end until the answer fits."""
        facts = [fact.encode() for fact in self.extract_facts(source)]
        summary = self.summarise(source)
        finish_reason = "stop"
        while True:
            text = json.dumps({"facts": facts, "summary": summary}, ensure_ascii=False)
            if estimate_tokens(text) <= tokens_max:
                return text, finish_reason
            finish_reason = "length"
            if facts:
                facts.pop()
            elif summary:
                summary = ""
            else:
                return "{}", finish_reason


def _last_user_text(request: CompletionRequest) -> str:
    for message in reversed(request.messages):
        if message.role == "user":
            return message.content
    return ""


def _truncate(text: str, tokens_max: int) -> tuple[str, str]:
    if estimate_tokens(text) <= tokens_max:
        return text, "stop"
    matches = list(_token_pattern.finditer(text))
    return text[: matches[tokens_max - 1].end()], "length"


def _pieces(text: str) -> list[str]:
    """Stream by sentence (keeping separators), so joined pieces equal the full text."""
    pieces = re.split(r"(?<=[。！？!?.\n])", text)
    return [piece for piece in pieces if piece]
