import troupe.http.knowledge as knowledge
from troupe.server import ServeError


def test_every_exported_name_resolves_and_is_listed_once():
    assert len(knowledge.__all__) == len(set(knowledge.__all__))
    for name in knowledge.__all__:
        assert getattr(knowledge, name) is not None, name


def test_the_backend_error_stops_serve_like_other_start_failures():
    assert issubclass(knowledge.KnowledgeBackendUnavailable, ServeError)
