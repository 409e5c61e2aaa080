"""troupe.sim: the deterministic simulator (never imported by production code).

``run_simulation(SimulationConfig(seed=...))`` runs the real runtime and storage under a seeded
Env with crashes, I/O faults, disk full and clock jumps, and checks the registered workloads'
invariants; ``sweep``, ``shrink`` and ``replay`` build on it (see docs/simulator.md).
"""

from ._network import NetworkFaults, SimulatedNetwork, simulated_http_client
from ._planted import planted_bug_names, workload_planted_bugs
from ._sim_env import InlineExecutor, SimClock, SimIds, SimRandom, sim_env
from ._simulation import SimulationConfig, SimulationResult, fault_names, run_simulation
from ._sweep import config_from_replay, replay, replay_document, shrink, sweep
from ._violation import Violation, as_violation
from ._workload import (
    Workload,
    World,
    check_shares,
    choose_by_share,
    make_workloads,
    read_checkpoint,
    register_workload,
    workload_names,
)
from ._workload_http import HttpExchange, json_or_none, retry_seconds, send_retrying, send_traced

__all__ = [
    "HttpExchange",
    "InlineExecutor",
    "NetworkFaults",
    "SimulatedNetwork",
    "Violation",
    "SimClock",
    "SimIds",
    "SimRandom",
    "SimulationConfig",
    "SimulationResult",
    "Workload",
    "World",
    "as_violation",
    "check_shares",
    "choose_by_share",
    "config_from_replay",
    "fault_names",
    "json_or_none",
    "make_workloads",
    "planted_bug_names",
    "read_checkpoint",
    "register_workload",
    "replay",
    "replay_document",
    "retry_seconds",
    "run_simulation",
    "send_retrying",
    "send_traced",
    "shrink",
    "sim_env",
    "simulated_http_client",
    "sweep",
    "workload_names",
    "workload_planted_bugs",
]
