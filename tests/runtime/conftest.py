import pytest

from troupe.sim._sim_env import sim_env


@pytest.fixture
def env(tmp_path):
    return sim_env(1, str(tmp_path))
