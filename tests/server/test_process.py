"""``troupe serve``'s process set-up: the start-up heap leaves the collector's walks."""

import gc

from troupe.server._process import freeze_startup_heap


def test_freeze_startup_heap_moves_live_objects_out_of_the_collected_generations():
    kept = [[index] for index in range(1000)]  # tracked containers alive at start-up
    try:
        frozen = freeze_startup_heap()
        assert frozen == gc.get_freeze_count() >= len(kept)
        assert not any(container is kept for generation in range(3) for container in gc.get_objects(generation))
    finally:
        gc.unfreeze()  # the test process goes on; serve's process never unfreezes
    assert gc.get_freeze_count() == 0
