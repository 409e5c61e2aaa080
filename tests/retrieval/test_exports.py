import troupe.retrieval


def test_exports_resolve():
    for name in troupe.retrieval.__all__:
        assert getattr(troupe.retrieval, name) is not None
    assert sorted(troupe.retrieval.__all__) == troupe.retrieval.__all__
