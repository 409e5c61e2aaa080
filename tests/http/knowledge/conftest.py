import fcntl
import os
import tempfile

import pytest

from ._knowledge_harness import start_knowledge_server


@pytest.fixture
async def knowledge_server(nursery, tmp_path):
    return await start_knowledge_server(nursery, str(tmp_path / "data"))


@pytest.fixture
async def client(knowledge_server):
    async with knowledge_server.client() as client:
        yield client


@pytest.fixture
def mdns_turn():
    """mDNS on loopback: every instance on the machine sees every announcement, so the tests
    that announce take turns across pytest's worker processes (``make test`` runs two): an
    exclusive lock on one file for the whole test.  A lock file, not an xdist group: pytest 9
    derives node ids from a structure pytest-xdist 3.8 cannot suffix, so its ``loadgroup``
    groups nothing."""
    path = os.path.join(tempfile.gettempdir(), "troupe-tests-mdns.lock")
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
