import troupe.actors.host
import troupe.http.host
from troupe.http.host import body_bytes_max_for, entry_segment


def test_every_exported_name_resolves():
    for package in (troupe.http.host, troupe.actors.host):
        for name in package.__all__:
            assert getattr(package, name) is not None, f"{package.__name__}.{name}"


def test_the_surface_is_named_host_on_8080_with_its_kinds_and_migrations():
    surface = troupe.http.host.host_surface
    assert surface.name == "host"
    assert (surface.listen_default.host, surface.listen_default.port) == ("127.0.0.1", 8080)
    assert [kind.name for kind in surface.actor_kinds] == ["entry", "host_media", "host_state", "learner", "host_goals"]
    assert {migration.component for migration in surface.migrations} == {"auth", "host", "retrieval"}


def test_route_table():
    assert entry_segment("/api/v1/entries/a:b/messages") == "a:b"
    assert entry_segment("/api/v1/entries/a/b/prepare") == "a/b"
    assert entry_segment("/api/v1/entries//learn") == ""
    assert entry_segment("/api/v1/entries/a/other") is None
    assert entry_segment("/api/v1/state") is None
    assert body_bytes_max_for("POST", "/api/v1/entries/a/messages") == 64 * 1024 * 1024
    assert body_bytes_max_for("POST", "/api/v1/media") == 14 * 1024 * 1024
    assert body_bytes_max_for("PUT", "/api/v1/state") == 32768
    assert body_bytes_max_for("PATCH", "/api/v1/state") == 32768
    assert body_bytes_max_for("POST", "/api/v1/goals") == 32768
    assert body_bytes_max_for("PATCH", "/api/v1/goals/7") == 32768
    assert body_bytes_max_for("POST", "/api/v1/entries/a/prepare") == 256 * 1024
    assert body_bytes_max_for("POST", "/api/v1/feedback") == 256 * 1024


def test_contract_allowed_hosts_from_the_environment():
    assert troupe.http.host.contract_allowed_hosts({"IRIS_ALLOWED_HOSTS": " iris, ,other "}) == ("iris", "other")
    assert troupe.http.host.contract_allowed_hosts({}) == ()
