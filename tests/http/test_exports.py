import troupe.http
import troupe.server


def test_every_exported_name_resolves():
    for package in (troupe.http, troupe.server):
        for name in package.__all__:
            assert getattr(package, name) is not None, f"{package.__name__}.{name}"


def test_exception_hierarchies():
    from troupe.http import HttpError, MetricsError, SendTimeout
    from troupe.server import ListenerError, ListenerRefused, ServeError, UnknownSurface

    assert issubclass(SendTimeout, HttpError) and issubclass(MetricsError, HttpError)
    for error in (ListenerError, ListenerRefused, UnknownSurface):
        assert issubclass(error, ServeError)
