"""``/agent/context`` at scale: ``agent_context`` over ``--n`` knowledge items (issue 10's
target: p99 ≤ 50 ms at 100k), on a realistic corpus and on the adversarial one.

Not a test (pytest does not collect it): run it by hand,

    .venv/bin/python bench/knowledge_agent_context.py --n 100000 [--corpus varied|adversarial]

Corpora:
- ``varied``: sentences drawn from a few thousand words (Chinese two-character words and
  English words, Zipf-distributed like real text), each item with two to four entity names
  from a pool of names and a relation or two; 90% of the items in ``user:local``, the rest in
  twenty other scopes; one item in fifty has sensitive evidence.
- ``adversarial``: every item is twenty words from a pool of forty-five, so any query word
  matches about 45% of the items (the recall author's worst case).

The rows are written straight into the knowledge tables (one transaction), then the
knowledge index opens and reconciles them into the shared ``MemoryIndex`` (hashed embedder,
384 dimensions, the production default).  Timing is CPU time of this process
(``time.process_time``: every thread, not the time waiting for a core on a shared machine),
beside wall time.  Prints one JSON line; ``--profile`` prints the top of a cProfile instead; ``--data DIR``
keeps the corpus (a second run with the same arguments skips writing it).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import json
import pstats
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from troupe.actors.knowledge._agent_context import agent_context  # noqa: E402
from troupe.actors.knowledge._query import KnowledgeIndexes  # noqa: E402
from troupe.actors.knowledge._schema import knowledge_migrations  # noqa: E402
from troupe.models import HashedEmbedder  # noqa: E402
from troupe.retrieval import retrieval_migrations  # noqa: E402
from troupe.retrieval._filters import FacetBitmaps  # noqa: E402
from troupe.runtime._real_env import real_env  # noqa: E402
from troupe.storage import Engine, InlineExecutor  # noqa: E402

main_scope = "user:local"
base_time = 1_788_393_600.0
common_characters = (
    "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行"
    "学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因由其些然前外"
    "天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情"
    "者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计别她手角"
    "期根论运农指几九区强放决西被干做必战先回则任取据处队南给色光门即保治北造百规热领七海口东导器压志世金增争济阶油思术极交"
    "受联什认六共权收证改清美再采转更单风切打白教速花带安场身车例真务具万每目至达走积示议声报斗完类八离华名确才科张信马节话"
    "米整空元况今集温传土许步群广石记需段研界拉林律叫且究观越织装影算低持音众书布复容儿须际商非验连断深难近矿千周委素技备半"
    "办青省列习响约支般史感劳便团往酸历市克何除消构府称太准精值号率族维划选标写存候毛亲快效斯院查江型眼王按格养易置派层片始"
    "却专状育厂京识适属圆包火住调满县局照参红细引听该铁价严龙飞")


def _chinese_words(generator: random.Random, count: int) -> list[str]:
    words: set[str] = set()
    while len(words) < count:
        words.add(generator.choice(common_characters) + generator.choice(common_characters))
    return sorted(words)


def _english_words(generator: random.Random, count: int) -> list[str]:
    onsets, vowels, codas = "b c d f g h j k l m n p r s t v w z br ch cl dr gr pl sh st tr".split(), "aeiou", "nrstlmkpd"
    words: set[str] = set()
    while len(words) < count:
        syllables = generator.randint(1, 3)
        words.add("".join(generator.choice(onsets) + generator.choice(vowels) for _ in range(syllables))
                  + generator.choice(codas))
    return sorted(words)


@dataclasses.dataclass
class Corpus:
    chinese: list[str]
    english: list[str]
    names: list[str]
    weights_chinese: list[float]
    weights_english: list[float]

    @classmethod
    def make(cls, generator: random.Random, words: int) -> Corpus:
        chinese = _chinese_words(generator, words)
        english = _english_words(generator, words)
        names = [generator.choice(("Project ", "Dr. ", "")) + word.capitalize() for word in _english_words(generator, 1500)]
        names += ["「" + word + generator.choice(common_characters) + "」" for word in _chinese_words(generator, 1500)]
        zipf = [1.0 / (rank + 10) for rank in range(words)]
        return cls(chinese, english, names, zipf, zipf)

    def sentence(self, generator: random.Random, length: int) -> str:
        if generator.random() < 0.5:
            return "".join(generator.choices(self.chinese, self.weights_chinese, k=length)) + "。"
        return " ".join(generator.choices(self.english, self.weights_english, k=length)).capitalize() + "."


def varied_item(corpus: Corpus, generator: random.Random) -> tuple[str, dict, list[str], list[tuple[str, str, str]]]:
    names = [name.strip("「」") for name in generator.sample(corpus.names, generator.randint(2, 4))]
    title = corpus.sentence(generator, generator.randint(3, 6)).rstrip("。.")
    body = {"text": " ".join(corpus.sentence(generator, generator.randint(6, 14)) for _ in range(generator.randint(1, 3))),
            "who": names[0], "where": names[1]}
    relations = [(names[0], names[1], generator.choice(("KNOWS", "OWNS", "VISITED", "MENTIONS")))]
    return title, body, names, relations


adversarial_words = [f"w{number:02d}" for number in range(45)]


def adversarial_item(corpus: Corpus, generator: random.Random) -> tuple[str, dict, list[str], list[tuple[str, str, str]]]:
    words = generator.sample(adversarial_words, 20)
    return " ".join(words[:4]), {"text": " ".join(words)}, [], []


def write_corpus(connection, rows: list[tuple]) -> None:
    connection.executemany(
        "INSERT INTO knowledge_evidence (id, scope, source_type, raw_json, context_json, provenance_json, sensitivity, "
        "sensitivity_categories_json, quality_score, idempotency_key, origin, knowledge_id, created_at) "
        "VALUES (?, ?, 'MANUAL_CONFIG', ?, NULL, NULL, ?, '[]', ?, NULL, 'write', NULL, ?)",
        [(f"evd_{number:07d}", scope, json.dumps({"title": title, "body": body}, ensure_ascii=False), sensitivity,
          quality, created) for number, scope, title, body, names, relations, sensitivity, quality, created in rows])
    connection.executemany(
        "INSERT INTO knowledge_items (id, scope, status, version, title, body_json, origin_evidence_id, created_at, "
        "updated_at) VALUES (?, ?, 'ACTIVE', 1, ?, ?, ?, ?, ?)",
        [(f"knw_{number:07d}", scope, title, json.dumps(body, ensure_ascii=False), f"evd_{number:07d}", created, created)
         for number, scope, title, body, names, relations, sensitivity, quality, created in rows])
    connection.executemany(
        "INSERT INTO knowledge_links (knowledge_id, evidence_id, linked_at) VALUES (?, ?, ?)",
        [(f"knw_{number:07d}", f"evd_{number:07d}", row[-1]) for number, *row in rows])
    connection.executemany(
        "INSERT OR IGNORE INTO knowledge_entities (knowledge_id, name) VALUES (?, ?)",
        [(f"knw_{number:07d}", name) for number, _, _, _, names, *_ in rows for name in names])
    connection.executemany(
        "INSERT INTO knowledge_relations (knowledge_id, position, source, target, type) VALUES (?, ?, ?, ?, ?)",
        [(f"knw_{number:07d}", position, *relation) for number, _, _, _, _, relations, *_ in rows
         for position, relation in enumerate(relations)])


def queries(corpus: Corpus, generator: random.Random, count: int, adversarial: bool) -> list[str]:
    made = []
    for number in range(count):
        if adversarial:
            made.append(" ".join(generator.sample(adversarial_words, 3)))
        elif number % 10 == 0:
            made.append("火星上的独角兽 unicorn on mars")  # nothing matches
        elif number % 4 == 0:
            made.append(f"{generator.choice(corpus.names).strip('「」')} 最近怎么样")  # an entity name
        elif number % 2 == 0:
            made.append("".join(generator.choices(corpus.chinese, corpus.weights_chinese, k=generator.randint(2, 4))))
        else:
            made.append(" ".join(generator.choices(corpus.english, corpus.weights_english, k=generator.randint(2, 5))))
    return made


def percentile(values: list[float], share: float) -> float:
    return round(float(numpy.percentile(values, share)), 2)


async def run(arguments) -> dict:
    generator = random.Random(arguments.seed)
    corpus = Corpus.make(generator, arguments.words)
    make = adversarial_item if arguments.corpus == "adversarial" else varied_item
    scopes = [f"user:other{number}" for number in range(20)]
    with contextlib.ExitStack() as stack:
        directory = arguments.data or stack.enter_context(tempfile.TemporaryDirectory())
        built = Path(directory, "built").exists()
        env = dataclasses.replace(real_env(directory), embedder=HashedEmbedder())
        if arguments.inline:  # every job on this thread, so that cProfile sees the SQL too
            env = dataclasses.replace(env, executor=InlineExecutor())
        async with trio.open_nursery() as nursery:
            engine = await Engine.open(env, nursery=nursery,
                                       migrations=[*knowledge_migrations, *retrieval_migrations()])
            started = time.perf_counter()
            batch: list[tuple] = []
            for number in range(0 if built else arguments.n):
                title, body, names, relations = make(corpus, generator)
                scope = main_scope if generator.random() < 0.9 else generator.choice(scopes)
                sensitivity = 1 if generator.random() < 0.02 else 0
                created = base_time - generator.random() * 365 * 86400
                batch.append((number, scope, title, body, names, relations, sensitivity,
                              round(0.6 + 0.3 * generator.random(), 2), created))
                if len(batch) == 10_000 or number == arguments.n - 1:
                    await engine.write(lambda connection, batch=batch: write_corpus(connection, batch))
                    batch = []
            store_seconds = time.perf_counter() - started
            started = time.perf_counter()
            index = await KnowledgeIndexes().open(engine, env.embedder)
            open_seconds = time.perf_counter() - started
            Path(directory, "built").touch()
            asked = queries(corpus, generator, arguments.queries, arguments.corpus == "adversarial")

            async def once(query: str):
                return await agent_context(engine, index, env, query=query, scope=main_scope, session_id="s",
                                           turn_id="t", top_k=arguments.top_k, max_chars=4000)

            items = []
            for query in asked:  # warm-up
                items.append(len((await once(query)).items))
            if arguments.profile:
                profile = cProfile.Profile()
                profile.enable()
                for query in asked:
                    await once(query)
                profile.disable()
                pstats.Stats(profile).sort_stats("cumulative").print_stats(45)
                nursery.cancel_scope.cancel()
                return {}
            runs = []
            for _ in range(arguments.runs):
                cpu, wall = [], []
                for query in asked:
                    started_cpu, started_wall = time.process_time(), time.perf_counter()
                    await once(query)
                    cpu.append((time.process_time() - started_cpu) * 1000)
                    wall.append((time.perf_counter() - started_wall) * 1000)
                runs.append({"cpu_p50": percentile(cpu, 50), "cpu_p99": percentile(cpu, 99),
                             "wall_p50": percentile(wall, 50), "wall_p99": percentile(wall, 99)})
            nursery.cancel_scope.cancel()
    return {
        "bench": "knowledge_agent_context",
        "corpus": arguments.corpus,
        "n": arguments.n,
        "queries": len(asked),
        "top_k": arguments.top_k,
        "store_seconds": round(store_seconds, 1),
        "open_seconds": round(open_seconds, 1),
        "mean_items": round(sum(items) / len(items), 2),
        "cpu_p50_ms": statistics.median(run["cpu_p50"] for run in runs),
        "cpu_p99_ms": statistics.median(run["cpu_p99"] for run in runs),
        "wall_p50_ms": statistics.median(run["wall_p50"] for run in runs),
        "wall_p99_ms": statistics.median(run["wall_p99"] for run in runs),
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--corpus", choices=("varied", "adversarial"), default="varied")
    parser.add_argument("--words", type=int, default=3000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--inline", action="store_true", help="run storage jobs on the event loop's thread")
    parser.add_argument("--facet-prefilter", action="store_true",
                        help="always use the text index's facet pre-filter (the behaviour before it was skipped)")
    parser.add_argument("--data", help="keep the corpus in this directory and reuse it when it is there")
    arguments = parser.parse_args()
    if arguments.facet_prefilter:
        FacetBitmaps.admits_most_items = lambda self, candidates: False
    result = trio.run(run, arguments)
    if result:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
