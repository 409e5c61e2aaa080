"""The linearizability checker on hand-made histories."""

import time

from troupe.runtime import Tracer, read_trace
from troupe.sim._history import History, check_linearizable


class RegisterModel:
    """A read/write register starting at 0."""

    initial = 0
    read_only = frozenset({"read"})

    def step(self, state, name, argument):
        if name == "write":
            return argument, "ok"
        return state, state


def test_sequential_history_is_linearizable():
    history = History()
    write = history.invoke(1, "x", "write", 5)
    history.complete(write, "ok", "ok")
    read = history.invoke(2, "x", "read")
    history.complete(read, "ok", 5)
    assert check_linearizable(history, RegisterModel()) == []


def test_concurrent_operations_may_be_ordered_either_way():
    history = History()
    write = history.invoke(1, "x", "write", 5)
    read = history.invoke(2, "x", "read")
    history.complete(read, "ok", 0)  # read before the write took effect: fine
    history.complete(write, "ok", "ok")
    read_again = history.invoke(2, "x", "read")
    history.complete(read_again, "ok", 5)
    assert check_linearizable(history, RegisterModel()) == []


def test_stale_read_after_acknowledged_write_is_caught_with_its_sequences():
    tracer = Tracer(keep_in_memory=True)
    history = History(tracer)
    write = history.invoke(1, "x", "write", 5)
    history.complete(write, "ok", "ok")
    read = history.invoke(2, "x", "read")
    history.complete(read, "ok", 0)
    violations = check_linearizable(history, RegisterModel(), kind="register")
    assert len(violations) == 1
    violation = violations[0]
    assert violation.text.startswith("not linearizable: x: read(None) returned 0")
    assert violation.actors == (("register", "x"),)
    # The stale read's invoke and ack, and the write it should have seen.
    assert set(violation.sequences) == {read.sequence, read.complete_sequence,
                                        write.sequence, write.complete_sequence}
    events = [record[2] for record in read_trace(b"".join(tracer.records))]
    assert events == ["invoke", "ack", "invoke", "ack"]


def test_unknown_write_may_have_taken_effect_or_not():
    for seen in (0, 7):
        history = History()
        write = history.invoke(1, "x", "write", 7)
        history.complete(write, "unknown")
        read = history.invoke(2, "x", "read")
        history.complete(read, "ok", seen)
        assert check_linearizable(history, RegisterModel()) == [], seen


def test_unknown_write_cannot_take_effect_twice_or_before_it_was_invoked():
    history = History()
    read = history.invoke(2, "x", "read")
    history.complete(read, "ok", 7)  # sees a write nobody had invoked yet
    write = history.invoke(1, "x", "write", 7)
    history.complete(write, "unknown")
    assert len(check_linearizable(history, RegisterModel())) == 1

    history = History()
    write = history.invoke(1, "x", "write", 7)
    history.complete(write, "unknown")
    for value in (7, 0, 7):  # appears, vanishes, appears again
        read = history.invoke(2, "x", "read")
        history.complete(read, "ok", value)
    assert len(check_linearizable(history, RegisterModel())) == 1


def test_failed_operation_must_not_be_seen():
    history = History()
    write = history.invoke(1, "x", "write", 3)
    history.complete(write, "fail")
    read = history.invoke(2, "x", "read")
    history.complete(read, "ok", 3)
    assert len(check_linearizable(history, RegisterModel())) == 1


def test_retries_merge_into_one_operation_and_resolution_settles_unknowns():
    history = History()
    first = history.invoke(1, "x", "write", 4, operation_id="w1")
    history.complete(first, "unknown")
    retry = history.invoke(1, "x", "write", 4, operation_id="w1")
    assert retry.operation is first.operation and len(first.operation.attempts) == 2
    history.complete(retry, "ok", "ok")
    assert first.operation.status == "ok"

    lost = history.invoke(2, "x", "write", 9, operation_id="w2")
    history.complete(lost, "unknown")
    assert lost.operation.status == "unknown"
    history.resolve(lost.operation, applied=False)
    assert lost.operation.status == "fail"
    read = history.invoke(2, "x", "read")
    history.complete(read, "ok", 9)  # saw a write that storage says never happened
    assert len(check_linearizable(history, RegisterModel())) == 1


def test_pending_operation_counts_as_unknown():
    history = History()
    history.invoke(1, "x", "write", 2)  # the process died before the reply
    read = history.invoke(2, "x", "read")
    history.complete(read, "ok", 2)
    assert check_linearizable(history, RegisterModel()) == []


def test_keys_are_checked_apart():
    history = History()
    write = history.invoke(1, "x", "write", 1)
    history.complete(write, "ok", "ok")
    read = history.invoke(1, "y", "read")
    history.complete(read, "ok", 0)
    assert check_linearizable(history, RegisterModel()) == []


def test_the_cap_makes_a_key_undecided_not_violated():
    history = History()
    writes = [history.invoke(client, "x", "write", client) for client in range(12)]
    for write in writes:
        history.complete(write, "unknown")
    read = history.invoke(99, "x", "read")
    history.complete(read, "ok", 1000)  # impossible, but proving it needs every subset
    assert check_linearizable(history, RegisterModel(), configurations_max=50) == []
    assert history.undecided_keys == ["x"]
    assert len(check_linearizable(history, RegisterModel())) == 1
    assert history.undecided_keys == []


def test_two_thousand_operations_with_four_clients_check_quickly():
    class CounterModel:
        initial = 0
        read_only = frozenset({"read"})

        def step(self, state, name, argument):
            if name == "add":
                return state + argument, state + argument
            return state, state

    history = History()
    value = 0
    in_flight = []
    for number in range(2000):
        client = number % 4
        if number % 3 == 2:
            attempt = history.invoke(client, "k", "read")
            in_flight.append((attempt, None))
        else:
            attempt = history.invoke(client, "k", "add", 1)
            in_flight.append((attempt, 1))
        if len(in_flight) == 4:  # four clients overlap, then all reply in invocation order
            for attempt, amount in in_flight:
                if amount is None:
                    history.complete(attempt, "ok", value)
                elif number % 50 == 0:
                    value += amount
                    history.complete(attempt, "unknown")
                else:
                    value += amount
                    history.complete(attempt, "ok", value)
            in_flight = []
    started = time.perf_counter()
    assert check_linearizable(history, CounterModel()) == []
    assert time.perf_counter() - started < 3.0
