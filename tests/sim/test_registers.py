"""The registers workload: quiet under a correct runtime, and each check fires on a bad situation."""

import pytest

from troupe.runtime import Tracer
from troupe.sim import SimulationConfig, World, run_simulation
from troupe.sim._history import check_linearizable
from troupe.sim._registers import (
    Append,
    LogModel,
    RegistersWorkload,
    Schedule,
    _Durable,
    log_digest,
    service_down_seconds_max,
    timer_late_seconds_max,
)
from troupe.sim._sim_env import SimRandom, sim_env


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_quiet_under_a_correct_runtime(seed):
    result = run_simulation(SimulationConfig(seed=seed, steps=300, workloads=("registers",)))
    assert [str(violation) for violation in result.violations] == []


class FakeContext:
    def __init__(self, key, discarded=False):
        self.key = key
        self.discarded = discarded


def make_workload(tmp_path):
    env = sim_env(1, str(tmp_path))
    world = World(env=env, random=SimRandom(1), tracer=Tracer(keep_in_memory=True), planted_bugs=frozenset())
    world.generation = 1
    workload = RegistersWorkload()
    workload._bind(world)
    return workload, world


def texts(workload):
    return [violation.text for violation in workload._take()]


async def test_a_second_delivery_of_one_send_is_a_violation(tmp_path):
    workload, _ = make_workload(tmp_path)
    instance = workload._activated(FakeContext("reg-0"))
    message = Append("r0-1", "r0-1.1", 0.0)
    workload._turn(instance, message)
    assert texts(workload) == []
    workload._turn(instance, message)
    assert texts(workload) == ["message delivered twice: r0-1.1 to reg-0"]


async def test_a_turn_on_a_crashed_instance_is_a_dirty_instance(tmp_path):
    workload, _ = make_workload(tmp_path)
    instance = workload._activated(FakeContext("reg-0"))
    instance.state = "crashed"  # what Register.receive records when its turn raises
    workload._turn(instance, None)
    assert texts(workload) == [
        "turn ran on an instance whose turn crashed (the runtime kept a dirty instance): reg-0"
    ]


async def test_two_live_instances_of_one_key(tmp_path):
    workload, _ = make_workload(tmp_path)
    first = workload._activated(FakeContext("reg-0"))
    workload._passivating(first)
    second = workload._activated(FakeContext("reg-0"))  # did not wait for the predecessor
    [violation] = workload._take()
    assert violation.text == "two live instances: reg-0 activated while an earlier instance was still passivating"
    assert len(violation.sequences) == 3
    # A predecessor that finished passivating, or that the runtime discarded, is fine.
    workload._passivated(first)
    second.context.discarded = True
    crashed = workload._activated(FakeContext("reg-2", discarded=True))
    workload._activated(FakeContext("reg-0"))
    workload._activated(FakeContext("reg-2", discarded=True))
    assert texts(workload) == []
    crashed.context.discarded = False  # ...but one the runtime kept alive is not
    workload._activated(FakeContext("reg-2"))
    assert texts(workload) == ["two live instances: reg-2 activated while an earlier instance was still live"]


async def test_timers_fire_once_and_not_never(tmp_path):
    workload, _ = make_workload(tmp_path)
    instance = workload._activated(FakeContext("reg-0"))
    workload._timer_started(instance, "r0-1.1")
    workload._timer_fired(instance, "r0-1.1")
    assert texts(workload) == []
    workload._timer_fired(instance, "r0-1.1")
    assert texts(workload) == ["timer fired twice: r0-1.1 on reg-0"]
    workload._timer_started(instance, "r0-2.1")
    due, _ = instance.timers["r0-2.1"]
    workload._turn(instance, Append("r0-3", "r0-3.1", due + 0.01))  # too soon to tell
    assert texts(workload) == []
    workload._turn(instance, Append("r0-4", "r0-4.1", due + timer_late_seconds_max + 1))
    [text] = texts(workload)
    assert text.startswith("timer never fired: r0-2.1 on reg-0")


async def test_a_service_down_longer_than_its_restart_budget(tmp_path):
    workload, world = make_workload(tmp_path)
    workload.service_down_since = 0.0
    workload.service_generation = 1
    workload._check_service(world, service_down_seconds_max - 0.1)
    assert texts(workload) == []
    workload._check_service(world, service_down_seconds_max + 0.1)
    [text] = texts(workload)
    assert text.startswith("service down too long: register-ticker")
    # An outage that ended with its process (a crash) is not the service's fault.
    workload.service_down_since = 10.0
    workload.last_seen[1] = 10.5
    world.generation = 2
    workload._check_service(world, 100.0)
    assert texts(workload) == []


async def test_durable_checks_count_applications_and_lost_reminders(tmp_path):
    workload, world = make_workload(tmp_path)
    history = workload.history
    acked = history.invoke(0, "reg-0", "append", "r0-1", operation_id="r0-1")
    history.complete(acked, "ok", 1)
    failed = history.invoke(1, "reg-0", "append", "r1-2", operation_id="r1-2")
    history.complete(failed, "fail")
    lost = history.invoke(2, "reg-0", "append", "r2-3", operation_id="r2-3")
    history.complete(lost, "ok", 2)
    scheduled = history.invoke(3, "reg-0", "schedule", None, operation_id="r3-4")
    history.complete(scheduled, "ok", "scheduled")
    durable = {"reg-0": _Durable(appends=["r0-1", "r1-2", "r0-1"], scheduled=["r3-4"])}
    for key in ("reg-1", "reg-2"):
        durable[key] = _Durable()
    found = sorted(violation.text for violation in workload._durable_violations(durable, world, final=True))
    assert found == [
        "acknowledged write lost: r2-3 on reg-0",
        "effect applied twice: r0-1 is 2 times in reg-0's log",
        "failed write applied: r1-2 on reg-0",
        "scheduled operation never completed: r3-4 on reg-0, its reminder is gone",
    ]


def test_a_read_of_a_write_that_storage_never_had_is_not_linearizable(tmp_path):
    workload, _ = make_workload(tmp_path)
    history = workload.history
    write = history.invoke(0, "reg-0", "append", "r0-1", operation_id="r0-1")
    history.complete(write, "unknown")  # its turn crashed
    read = history.invoke(1, "reg-0", "read")
    history.complete(read, "ok", log_digest(["r0-1"]))  # a dirty instance answered
    workload._resolve({"reg-0": _Durable()})  # storage: never applied
    [violation] = check_linearizable(history, LogModel(), kind="register")
    assert violation.text.startswith("not linearizable: reg-0: read(None)")


def test_schedule_message_is_a_frozen_dataclass():
    message = Schedule("r0-1", "r0-1.1", 0.0, 0.5)
    with pytest.raises(AttributeError):
        message.delay_seconds = 1.0
