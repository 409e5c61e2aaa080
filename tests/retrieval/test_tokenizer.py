from troupe.retrieval._query import text_query
from troupe.retrieval._tokenizer import document_tokens, query_terms


def search(connection, query: str) -> list[int]:
    expression = text_query(query).match_expression()
    return [
        row
        for (row,) in connection.execute(
            "SELECT rowid FROM retrieval_text WHERE retrieval_text MATCH ?"
            " ORDER BY bm25(retrieval_text)",
            (expression,),
        )
    ]


def add_texts(connection, texts: list[str]) -> None:
    for number, text in enumerate(texts, start=1):
        connection.execute(
            "INSERT INTO retrieval_text(rowid, text, context, time_words) VALUES (?,?,'','')",
            (number, text),
        )


def test_two_character_chinese_queries_match(connection):
    add_texts(connection, ["我昨天晚上看星星了", "寿司很好吃", "今天天气不错"])
    assert search(connection, "星星") == [1]
    assert search(connection, "寿司") == [2]
    assert search(connection, "我想吃寿司") == [2]


def test_single_chinese_character_matches_every_position(connection):
    add_texts(connection, ["星空很美", "看星", "月亮"])
    assert sorted(search(connection, "星")) == [1, 2]
    assert search(connection, "美") == [1]


def test_mixed_corpus_chinese_and_english(connection):
    add_texts(
        connection,
        ["Caroline PAINTED a sunset", "我们去吃寿司 with Melanie", "Running helps me de-stress"],
    )
    assert search(connection, "paintings") == [1]
    assert search(connection, "sushi 寿司") == [2]
    assert search(connection, "melanie") == [2]
    assert search(connection, "runs") == [3]


def test_query_is_never_fts5_syntax(connection):
    add_texts(connection, ['he said "NEAR" AND OR NOT * ( )'])
    assert search(connection, 'NEAR" OR (') == [1]


def test_document_tokens_offsets_point_into_text():
    text = "Ｈｅｌｌｏ 小天's 寿司"
    for start, end, *tokens in document_tokens(text):
        assert text[start:end]
        assert all(token == token.casefold() for token in tokens)
    assert query_terms("小天喜欢寿司") == ["小天", "天喜", "喜欢", "欢寿", "寿司"]


def test_stop_words_leave_content_terms():
    assert text_query("What did Caroline paint last summer?").terms == (
        "caroline",
        "paint",
        "last",
        "summer",
    )
    assert "什么" not in text_query("用户喜欢什么食物？").terms
    assert text_query("what is it").terms  # only stop words: keep them
