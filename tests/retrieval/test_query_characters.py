"""What recall's added query terms cost (issue 14's CPU regression): the characters of a
query's short words and the digits of its numerals.  From ``query_character_pruning_items_min``
items on, a character in more than ``query_character_items_share_max`` of the items, or one
that finds nothing its two-character word does not, leaves the text query; digits of numerals
are searched in the message and its context only (the time words of every item hold digits)."""

import datetime

import pytest

from troupe.retrieval import MemoryIndex, MemoryItem, RecallFilter, RecallSettings, _store
from troupe.retrieval import _memory_index as memory_index_module
from troupe.retrieval._query import text_query
from troupe.retrieval._tokenizer import query_numbers, query_word_characters

base = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
tenant = "user:1"


def items(texts: list[str], first: int = 0) -> list[MemoryItem]:
    return [
        MemoryItem(
            key=f"m-{first + number}",
            text=text,
            tenant=tenant,
            created_at=base + datetime.timedelta(minutes=first + number),
        )
        for number, text in enumerate(texts)
    ]


@pytest.fixture
def expressions(monkeypatch):
    """The MATCH expressions recall's text lists run, and a small store pruning threshold:
    from 40 items on, share 0.1 (a limit of 4 items at 40 to 49 live items)."""
    seen: list[str] = []
    original = _store.text_search_lists

    def spy(connection, match_expression, **arguments):
        seen.append(match_expression)
        return original(connection, match_expression, **arguments)

    monkeypatch.setattr(_store, "text_search_lists", spy)
    monkeypatch.setattr(memory_index_module, "query_character_pruning_items_min", 40)
    monkeypatch.setattr(memory_index_module, "query_character_items_share_max", 0.1)
    return seen


async def searched(index: MemoryIndex, seen: list[str], query: str) -> str:
    seen.clear()
    index._term_counts.clear()  # counts are cached across writes; recount for the test
    # Common terms stay in: these tests are about the query characters' own pruning rule.
    await index.recall(query, recall_filter=RecallFilter(tenant), limit=5,
                       settings=RecallSettings(common_term_share_max=None))
    assert len(seen) == 1  # one text scan per recall
    return seen[0]


def test_query_word_characters_name_their_word():
    found = query_word_characters("用户的猫叫什么名字")
    assert found["猫"] == "猫叫" and found["名"] == "名字"
    assert "的" not in found and "什" not in found
    assert query_word_characters("hiking trip") == {}


def test_numeral_digits_are_searched_in_the_message_only():
    assert query_numbers("我有三只猫") == {"3"} and query_numbers("three cats") == {"3"}
    assert query_numbers("3只猫") == frozenset()  # typed: matches the time words as before
    assert query_numbers("三只猫，3只") == frozenset()
    assert '{text context} : "3"' in text_query("三只猫", characters=True).match_expression()
    assert '{text context}' not in text_query("3 cats").match_expression()


async def test_common_character_leaves_just_over_the_share(engine, expressions):
    index = await MemoryIndex.open(engine)
    filler = [f"今天第{number}次去公园散步" for number in range(36)]
    await index.add(items(filler + ["我家的橘猫很胖"] * 4))  # 40 live: 猫 in 4 = the limit
    assert '"猫"' in await searched(index, expressions, "用户的猫叫什么名字")
    await index.add(items(["猫粮买好了"], first=40))  # 41 live, limit 4: 猫 in 5, over
    expression = await searched(index, expressions, "用户的猫叫什么名字")
    assert '"猫"' not in expression and '"猫叫"' in expression and '"名字"' in expression


async def test_character_its_word_already_finds_leaves(engine, expressions):
    index = await MemoryIndex.open(engine)
    filler = [f"今天第{number}次去公园散步" for number in range(38)]
    await index.add(items(filler + ["同事请我吃饭", "和同事开会"]))
    expression = await searched(index, expressions, "同事最近怎么样")
    # 同 and 事 are only ever inside 同事: the bigram already matched all of them.
    assert '"同事"' in expression and '"同"' not in expression and '"事"' not in expression
    await index.add(items(["同学聚会"], first=40))  # 同 now finds an item 同事 does not
    expression = await searched(index, expressions, "同事最近怎么样")
    assert '"同"' in expression and '"事"' not in expression


async def test_small_stores_keep_every_character(engine, expressions):
    index = await MemoryIndex.open(engine)
    await index.add(items(["同事请我吃饭"] * 5 + ["我家的橘猫很胖"] * 34))  # 39: one below
    expression = await searched(index, expressions, "同事的猫叫什么")
    assert all(f'"{character}"' in expression for character in "同事猫叫")


async def test_only_characters_left_are_kept(engine, expressions):
    index = await MemoryIndex.open(engine)
    await index.add(items(["我家的橘猫很胖"] * 40))
    # 猫呢 is a particle bigram: 猫 is the whole query, common or not.
    assert '"猫"' in await searched(index, expressions, "猫呢")


async def test_numeral_digits_do_not_match_the_time_words(engine):
    index = await MemoryIndex.open(engine)
    march_third = datetime.datetime(2026, 3, 3, 12, tzinfo=datetime.UTC)
    await index.add([
        MemoryItem(key="film", text="看电影", tenant=tenant, created_at=march_third),
        MemoryItem(key="cats", text="我有3只猫", tenant=tenant, created_at=base),
    ])
    result = await index.recall("三只狗", recall_filter=RecallFilter(tenant), limit=5)
    ranks = {hit.key: hit.ranks for hit in result.hits}
    assert "text" in ranks["cats"]
    assert "text" not in ranks.get("film", {})
