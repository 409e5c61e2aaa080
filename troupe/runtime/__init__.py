"""troupe.runtime: the actor kernel.

Virtual actors addressed by ``(kind, key)``, bounded mailboxes, ``ask``/``tell``, passivation
and LRU eviction, a supervisor tree with OTP strategies and restart intensity, durable
reminders, a structured trace, and the ``Env`` ports through which actors reach time,
randomness, ids, disk and network.
"""

from ._actor import Actor, ActorContext, ActorKind, ReminderFired, TaskEnded
from ._env import Clock, Env, Executor, IdSource, RandomSource, StorageOpener
from ._exceptions import (
    ActorCrashed,
    ActorError,
    AskTimeout,
    Overloaded,
    PoisonMessage,
    Unavailable,
    UnknownActorKind,
)
from ._fault_points import (
    FaultPoints,
    InjectedFault,
    NoFaultPoints,
    domain_fault_point_names,
    fault_point_names,
    no_fault_points,
)
from ._limits import RestartIntensity
from ._real_env import real_env
from ._supervisor import ChildSpec, Strategy, Supervisor, SupervisorEscalated
from ._system import (
    ActorRef,
    ActorSystem,
    KindStatistics,
    open_actor_system,
    runtime_event_kinds,
    runtime_planted_bugs,
    turn_latency_buckets_seconds,
)
from ._trace import Tracer, read_trace

__all__ = [
    "Actor",
    "ActorContext",
    "ActorCrashed",
    "ActorError",
    "ActorKind",
    "ActorRef",
    "ActorSystem",
    "AskTimeout",
    "ChildSpec",
    "Clock",
    "Env",
    "Executor",
    "FaultPoints",
    "IdSource",
    "InjectedFault",
    "KindStatistics",
    "NoFaultPoints",
    "Overloaded",
    "PoisonMessage",
    "RandomSource",
    "ReminderFired",
    "RestartIntensity",
    "StorageOpener",
    "Strategy",
    "Supervisor",
    "SupervisorEscalated",
    "TaskEnded",
    "Tracer",
    "Unavailable",
    "UnknownActorKind",
    "domain_fault_point_names",
    "fault_point_names",
    "no_fault_points",
    "open_actor_system",
    "read_trace",
    "real_env",
    "runtime_event_kinds",
    "runtime_planted_bugs",
    "turn_latency_buckets_seconds",
]
