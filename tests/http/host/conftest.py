import pytest

from ._host_harness import start_host_server


@pytest.fixture
async def host(nursery, tmp_path):
    return await start_host_server(nursery, str(tmp_path / "data"))
