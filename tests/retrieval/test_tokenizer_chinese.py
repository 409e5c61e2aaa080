"""One-character words, folding, numbers and aliases in the Chinese/English tokenizer."""

import datetime

import pytest

from troupe.retrieval import MemoryIndex, MemoryItem, RecallFilter
from troupe.retrieval._aliases import (
    AliasTable,
    alias_pairs,
    alias_terms_added_max,
    aliases_per_tenant_max,
)
from troupe.retrieval._numbers import (
    chinese_number_value,
    chinese_numbers,
    chinese_numeral_characters_max,
    english_number,
)
from troupe.retrieval._query import text_query
from troupe.retrieval._segmenter import fold_characters
from troupe.retrieval._tokenizer import document_tokens, query_terms, query_word_characters_max

from .test_tokenizer import add_texts


def search(connection, query: str) -> list[int]:
    """Like recall's text lists: the query with its words' characters."""
    expression = text_query(query, characters=True).match_expression()
    return [
        row
        for (row,) in connection.execute(
            "SELECT rowid FROM retrieval_text WHERE retrieval_text MATCH ?"
            " ORDER BY bm25(retrieval_text)",
            (expression,),
        )
    ]

moment = datetime.datetime(2026, 5, 1, 12, tzinfo=datetime.UTC)


def test_one_character_word_inside_a_query_meets_a_compound(connection):
    add_texts(connection, ["我养了一只橘猫，叫小橘", "用户的名字叫小明", "我开电动车上班"])
    # 猫 now meets 橘猫 (it used to exist only as the bigram 猫叫); which of the two comes
    # first is fusion's business (the 名字 memory shares more words).
    assert 1 in search(connection, "用户的猫叫什么名字")
    assert 3 in search(connection, "你的车是什么车")
    assert search(connection, "猫") == [1]


def test_two_character_words_and_phrases_keep_matching(connection):
    add_texts(connection, ["我最喜欢特斯拉的车", "寿司很好吃", "特别的斯拉夫音乐"])
    assert search(connection, "寿司") == [2]
    # A three-character word is a phrase of consecutive bigrams: positions stay consecutive.
    rows = list(
        connection.execute(
            "SELECT rowid FROM retrieval_text WHERE retrieval_text MATCH ?", ('"特斯拉"',)
        )
    )
    assert rows == [(1,)]


def test_index_holds_every_character_colocated_with_its_bigram():
    tokens = list(document_tokens("橘猫"))
    assert tokens == [(0, 2, "橘猫", "橘"), (1, 2, "猫")]
    assert list(document_tokens("橘猫", query=True)) == [(0, 2, "橘猫")]
    assert list(document_tokens("猫", query=True)) == [(0, 1, "猫")]


def test_traditional_and_full_width_fold(connection):
    assert fold_characters("貓叫什麼") == "猫叫什么"
    add_texts(connection, ["我的貓很可愛", "ＴＥＳＬＡ　Model ３"])
    assert search(connection, "猫") == [1]
    assert search(connection, "可爱") == [1]
    assert search(connection, "tesla") == [2]
    assert search(connection, "3") == [2]


def test_query_characters_skip_function_words_and_long_words():
    terms = query_terms("用户的猫叫什么名字", characters=True)
    assert "猫" in terms and "什" not in terms and "的" not in terms
    assert query_terms("用户的猫叫什么名字")[:2] == ["用户", "户的"]  # plain form: no characters
    assert "特" not in query_terms("特斯拉", characters=True)  # longer than the word limit
    assert query_word_characters_max == 2
    assert "猫" in text_query("用户的猫呢", characters=True).terms
    assert "猫" not in text_query("用户的猫呢").terms  # forget and feedback: plain terms


def test_a_three_character_phrase_around_a_function_character_adds_its_other_characters():
    terms = query_terms("用户晚上睡不着觉吗", characters=True)
    assert "睡" in terms and "着" in terms and "不" not in terms  # 睡不着 meets 睡着
    assert {"另", "半"} <= set(query_terms("用户的另一半做什么的", characters=True))
    assert not {"特", "斯", "拉", "朝", "阳", "区"} & set(query_terms("特斯拉在朝阳区", characters=True))


def test_numbers_written_as_words(connection):
    assert [chinese_number_value(run) for run in ("三", "二十", "十五", "一百零五", "两万", "二〇二三")] == [
        3, 20, 15, 105, 20000, 2023,
    ]
    assert chinese_number_value("一") is None and chinese_number_value("万一") is None
    assert chinese_number_value("十十") is None
    assert chinese_numbers("我有三只猫") == [(2, "3")]
    assert english_number("three") == "3" and english_number("twenty-three") == "23"
    assert english_number("house") is None
    longest = "三" * chinese_numeral_characters_max
    assert chinese_number_value(longest) is not None
    assert chinese_number_value(longest + "三") is None
    add_texts(connection, ["我家有三只猫", "I have 3 dogs", "she is twenty now", "二十个苹果"])
    assert sorted(search(connection, "3")) == [1, 2]
    assert sorted(search(connection, "three")) == [1, 2]
    assert sorted(search(connection, "20")) == [3, 4]
    assert 1 in search(connection, "几只猫，三只？")


def test_alias_pairs_need_an_explicit_pairing():
    assert alias_pairs("我买了一辆特斯拉（Tesla）Model 3") == [("特斯拉", "tesla")]
    assert alias_pairs("Tesla (特斯拉) 是我的车") == [("特斯拉", "tesla")]
    assert alias_pairs("星巴克/Starbucks 的拿铁") == [("星巴克", "starbucks")]
    assert alias_pairs("我在Starbucks喝了咖啡") == []
    assert alias_pairs("他的英文名叫David") == []


def test_alias_table_is_per_tenant_and_bounded():
    table = AliasTable()
    table.observe("a", "我买了一辆特斯拉（Tesla）")
    assert table.expand("a", "我的Tesla呢", ("tesla",)) == ("tesla", "特斯拉")
    assert table.expand("a", "特斯拉多少钱", ("特斯", "斯拉")) == ("特斯", "斯拉", "tesla")
    assert table.expand("b", "我的Tesla呢", ("tesla",)) == ("tesla",)
    for number in range(aliases_per_tenant_max):
        table.observe("c", f"名字{chr(0x4E00 + number % 500)}{chr(0x4E00 + number // 500)}（N{number}）")
    full = len(table.aliases("c"))
    table.observe("c", "特斯拉（Tesla）")
    assert len(table.aliases("c")) == full and "特斯拉" not in table.aliases("c")
    many = AliasTable()
    for number in range(alias_terms_added_max + 1):
        many.observe("t", f"特斯拉（Name{number}）")
    assert len(many.expand("t", "特斯拉", ())) == alias_terms_added_max


@pytest.fixture
async def index(engine):
    return await MemoryIndex.open(engine)


async def test_recall_expands_aliases_from_the_tenants_own_items(index):
    await index.add(
        [
            MemoryItem("car", "用户买了一辆特斯拉（Tesla）", "t", moment),
            MemoryItem("service", "特斯拉下周二要去保养", "t", moment),
            MemoryItem("other", "Tesla stock went up", "u", moment),
        ]
    )
    result = await index.recall("When is my Tesla service?", recall_filter=RecallFilter("t"))
    assert {hit.key for hit in result.hits} == {"car", "service"}
    result = await index.recall("猫", recall_filter=RecallFilter("t"))
    assert result.hits == []
