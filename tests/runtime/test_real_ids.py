"""The real Env's ids: unique within and across processes, ordered by creation, no system
call per id (``RealIds``)."""

import re

from troupe.runtime._real_env import RealIds, RealRandom


class SteppingClock:
    def __init__(self, *walls: float) -> None:
        self.walls = list(walls)

    def wall(self) -> float:
        return self.walls.pop(0) if len(self.walls) > 1 else self.walls[0]


def test_ids_keep_their_historic_shape_and_sort_by_creation():
    ids = RealIds(SteppingClock(1.000, 1.000, 1.0015, 2.5), RealRandom())
    made = [ids.new_id("recall_") for _ in range(4)]
    assert all(re.fullmatch(r"recall_[0-9a-f]{28}", value) for value in made)
    assert made[2][7:19] == f"{1001:012x}"
    assert made[0] < made[1] < made[2] < made[3]  # lexicographic = creation order


def test_ids_are_unique_within_a_process_even_in_one_millisecond():
    ids = RealIds(SteppingClock(5.0), RealRandom())
    made = [ids.new_id() for _ in range(100_000)]
    assert len(set(made)) == len(made)


def test_a_wall_clock_stepping_back_never_moves_ids_back():
    ids = RealIds(SteppingClock(10.0, 9.0, 9.5), RealRandom())
    first, second, third = ids.new_id(), ids.new_id(), ids.new_id()
    assert first[:12] == second[:12] == third[:12] == f"{10_000:012x}"
    assert first < second < third


def test_two_processes_in_the_same_millisecond_do_not_collide():
    # A restart (or a second process) draws its own random part and counter start.
    one, other = RealIds(SteppingClock(7.0), RealRandom()), RealIds(SteppingClock(7.0), RealRandom())
    made_one = {one.new_id() for _ in range(1000)}
    made_other = {other.new_id() for _ in range(1000)}
    assert not made_one & made_other


def test_the_counter_wraps_within_its_width():
    ids = RealIds(SteppingClock(1.0), RealRandom())
    ids._counter = iter([16**8 - 1, 16**8])  # the last value, then one past it
    assert ids.new_id()[-8:] == "ffffffff"
    assert ids.new_id()[-8:] == "00000000"
