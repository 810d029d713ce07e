"""The gate small kernel calls take turns at: one thread inside at a time, every waiter gets
its turn while another thread keeps coming back, and a waiter that gives up leaves no trace."""

from __future__ import annotations

import threading
import time

import pytest

from portkern.jit import gate as gate_module
from portkern.jit.gate import Gate

#: Seconds a test's threads may take before it fails (a starved or stuck thread never ends).
BOUND_S = 60


def _run(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=BOUND_S)
    assert not any(thread.is_alive() for thread in threads), "a thread never got through the gate"


def test_one_thread_inside_at_a_time():
    gate = Gate()
    inside, most, passes = [0], [0], [0]

    def work() -> None:
        for _ in range(300):
            gate.enter(1e-5)
            try:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
                time.sleep(0)  # let the others run while this thread is inside
                inside[0] -= 1
                passes[0] += 1
            finally:
                gate.leave()

    _run([threading.Thread(target=work) for _ in range(6)])
    assert (most[0], passes[0]) == (1, 6 * 300)


def test_a_waiter_gets_its_turn_while_another_thread_keeps_coming_back(monkeypatch):
    """The thread inside barges back in after each pass until a waiter's turn is due; then it
    hands over. Without turns the hammering thread would keep the gate to itself."""
    monkeypatch.setattr(gate_module, "TURN_S", 0.002)
    gate = Gate()
    done = threading.Event()
    counts = {"hammer": 0, "waiter": 0}

    def hammer() -> None:
        while not done.is_set():
            gate.enter(1e-5)
            counts["hammer"] += 1
            gate.leave()

    def waiter() -> None:
        for _ in range(20):
            gate.enter(1e-5)
            counts["waiter"] += 1
            gate.leave()
            time.sleep(0)
        done.set()

    hammering = threading.Thread(target=hammer)
    hammering.start()
    try:
        _run([threading.Thread(target=waiter)])
    finally:
        done.set()
        hammering.join(timeout=BOUND_S)
    assert counts["waiter"] == 20 and counts["hammer"] > 0


def test_a_gate_left_open_is_taken_by_its_waiter(monkeypatch):
    """A waiter whose turn is not due yet still goes in soon after the thread inside leaves
    for good (it looks for itself after about one call's time)."""
    monkeypatch.setattr(gate_module, "TURN_S", 3600.0)
    gate = Gate()
    gate.enter(1e-5)
    entered = threading.Event()

    def wait() -> None:
        gate.enter(1e-3)
        entered.set()
        gate.leave()

    waiting = threading.Thread(target=wait)
    waiting.start()
    time.sleep(0.05)
    assert not entered.is_set()
    gate.leave()
    assert entered.wait(BOUND_S)
    waiting.join(timeout=BOUND_S)


def test_each_waiter_in_line_takes_a_gate_left_open(monkeypatch):
    """Threads that leave for good one after another: the waiter that comes first in line
    when the one ahead of it goes in is woken then, and takes the gate once it is left open
    (it would otherwise nap a whole turn, here an hour)."""
    monkeypatch.setattr(gate_module, "TURN_S", 3600.0)
    gate = Gate()
    gate.enter(1e-5)
    order: list[int] = []

    def once(i: int) -> None:
        gate.enter(1e-4)
        order.append(i)
        gate.leave()

    threads = [threading.Thread(target=once, args=(i,)) for i in range(3)]
    for i, thread in enumerate(threads):
        thread.start()
        while len(gate._waiters) <= i:  # in line, in this order
            time.sleep(0.001)
    gate.leave()
    for thread in threads:
        thread.join(timeout=BOUND_S)
    assert order == [0, 1, 2]


class _Interrupted(BaseException):
    pass


def test_a_waiter_interrupted_while_waiting_leaves_no_trace(monkeypatch):
    """A KeyboardInterrupt (here a stand-in) while waiting takes the waiter out of the line,
    or passes the gate on if it had just been handed over; later threads get in as usual."""
    gate = Gate()
    gate.enter(1e-5)

    class Interrupting:
        """A waiter's wake-up lock whose wait is interrupted."""

        def acquire(self, timeout: float) -> bool:
            raise _Interrupted

    waiter = gate_module._Waiter
    monkeypatch.setattr(gate_module, "_Waiter", lambda nap_s: waiter(nap_s, Interrupting()))
    with pytest.raises(_Interrupted):
        gate.enter(1e-5)
    monkeypatch.setattr(gate_module, "_Waiter", waiter)
    assert not gate._waiters
    gate.leave()
    entered = threading.Event()

    def enter() -> None:
        gate.enter(1e-5)
        entered.set()
        gate.leave()

    _run([threading.Thread(target=enter)])
    assert entered.is_set()


def _window(choice: gate_module.Choice, start: float, calls: int, overlap: float = 2.0) -> float:
    """`calls` calls finishing evenly over one trial window from `start`, `overlap` of them in
    flight at a time; the window's end."""
    end = start + gate_module.TRIAL_S * 1.001  # the last call closes the window
    step = (end - start) / calls
    for i in range(calls):
        done = start + (i + 1) * step
        choice.record(done - overlap * step, done, round(overlap))
    return end


@pytest.mark.parametrize(("gated_calls", "side_by_side_calls", "chosen"), [(900, 400, True), (500, 1000, False)])
def test_choice_keeps_the_way_that_made_more_calls(gated_calls, side_by_side_calls, chosen):
    choice = gate_module.Choice(0.0)
    assert choice.gated  # before any trial: turns, which never collapse
    now = _window(choice, 0.0, gated_calls)
    assert not choice.gated  # the other way next: a window to settle, then one timed
    now = _window(choice, now, 10)
    assert not choice.gated
    now = _window(choice, now, side_by_side_calls)
    assert choice.gated is chosen
    for _ in range(gate_module.KEEP_WINDOWS):  # it stands, whatever these windows make
        now = _window(choice, now, 10)
        assert choice.gated is chosen
    _window(choice, now, 10)  # then both are tried again, from the way that stood
    assert choice.gated is not chosen


def test_choice_ignores_windows_whose_calls_did_not_overlap():
    choice = gate_module.Choice(0.0)
    now = 0.0
    for _ in range(3):
        now = _window(choice, now, 1000, overlap=1.0)  # one thread calling back to back
    assert choice.gated and not choice._rates
    _window(choice, now, 1000, overlap=2.0)
    assert not choice.gated


def _trial(choice: gate_module.Choice, now: float, gated_calls: int, side_by_side_calls: int, overlap: float = 2.0) -> float:
    """A whole trial from the way that stands (its window, a window to settle, the other way's window)."""
    calls = {True: gated_calls, False: side_by_side_calls}
    now = _window(choice, now, calls[choice.gated], overlap)
    now = _window(choice, now, 10, overlap)
    return _window(choice, now, calls[choice.gated], overlap)


def _stands(choice: gate_module.Choice, now: float, windows: int) -> float:
    way = choice.gated
    for _ in range(windows):
        now = _window(choice, now, 10)
        assert choice.gated is way
    return now


def test_a_way_that_keeps_winning_clearly_stands_longer():
    """Each further clear win doubles how long the winner stands (fewer trials, each of which
    spends windows on the losing way); a close trial brings it back to KEEP_WINDOWS."""
    choice = gate_module.Choice(0.0)
    now = _trial(choice, 0.0, 900, 400)
    assert choice.gated
    now = _stands(choice, now, gate_module.KEEP_WINDOWS)
    now = _trial(choice, now, 900, 400)
    assert choice.gated
    now = _stands(choice, now, 2 * gate_module.KEEP_WINDOWS)
    now = _trial(choice, now, 900, 800)  # close: it stands, for KEEP_WINDOWS only
    assert choice.gated
    now = _stands(choice, now, gate_module.KEEP_WINDOWS)
    _window(choice, now, 10)
    assert not choice.gated  # the next trial has begun


@pytest.mark.parametrize(
    ("gated_calls", "side_by_side_calls", "overlap", "tried"),
    [
        (400, 900, 8.0, True), (400, 900, 2.0, False),  # side by side won clearly
        (900, 400, 8.0, False), (900, 400, 2.0, False),  # turns won clearly
        (800, 900, 8.0, True), (800, 900, 2.0, True), (900, 800, 8.0, True),  # close
    ],
)
def test_other_callers_start_a_trial_at_once(gated_calls, side_by_side_calls, overlap, tried):
    """When the calls in flight change (here from 4 at a time), the way that stands is tried
    again at once rather than after its windows, unless it won clearly where the change
    cannot turn the tables: turns, or side by side with fewer callers."""
    choice = gate_module.Choice(0.0)
    now = _trial(choice, 0.0, gated_calls, side_by_side_calls, overlap=4.0)
    way = choice.gated
    for _ in range(3):
        now = _window(choice, now, 10, overlap=4.0)
        assert choice.gated is way
    _window(choice, now, 10, overlap=overlap)
    assert (choice.gated is not way) is tried


def test_waiters_behind_the_first_sleep_until_they_come_first(monkeypatch):
    """Only the first waiter looks for itself while a thread is inside; the ones behind it are
    not woken until they come first (each wake-up would cost the thread inside the GIL)."""
    monkeypatch.setattr(gate_module, "TURN_S", 3600.0)
    wakes: dict[int, int] = {}
    waiter = gate_module._Waiter

    class Counting:
        def __init__(self, index: int) -> None:
            self.index, self.lock = index, gate_module._closed_lock()

        def acquire(self, timeout: float) -> bool:
            wakes[self.index] = wakes.get(self.index, 0) + 1
            return self.lock.acquire(timeout=timeout)

        def release(self) -> None:
            self.lock.release()

    monkeypatch.setattr(gate_module, "_Waiter", lambda nap_s: waiter(nap_s, Counting(len(wakes))))
    gate = Gate()
    gate.enter(1e-4)

    def once() -> None:
        gate.enter(1e-4)
        gate.leave()

    threads = [threading.Thread(target=once) for _ in range(3)]
    for i, thread in enumerate(threads):
        thread.start()
        while len(gate._waiters) <= i:
            time.sleep(0.001)
    time.sleep(0.2)  # the first waiter looks a few times meanwhile
    seen = dict(wakes)
    gate.leave()
    for thread in threads:
        thread.join(timeout=BOUND_S)
    assert not any(thread.is_alive() for thread in threads)
    assert seen[0] >= 3 and seen[1] == seen[2] == 1, seen


def test_handoff_is_measured_once_per_process(monkeypatch):
    monkeypatch.setattr(gate_module, "_handoff", [])
    first = gate_module.handoff_s()
    assert 0 < first < 0.1 and gate_module.handoff_s() == first


@pytest.mark.parametrize(("native_s", "way"), [(1e-5, "turns"), (3e-5, "trial"), (None, "trial")])
def test_calls_whose_native_part_is_under_two_handoffs_always_take_turns(monkeypatch, native_s, way):
    """Side by side cannot pay where the GIL is away from the Python side for less than it
    takes to pass it to a sleeping thread and back; an unknown native part is tried."""
    monkeypatch.setattr(gate_module, "_handoff", [1e-5])
    chosen = gate_module.choose(native_s)
    assert (chosen is gate_module.TURNS) if way == "turns" else (isinstance(chosen, gate_module.Choice) and chosen.gated)


class _CountingLock:
    """A waiter's wake-up lock that counts the waits that timed out (its looks)."""

    looks = 0

    def __init__(self) -> None:
        self.lock = gate_module._closed_lock()

    def acquire(self, timeout: float) -> bool:
        woken = self.lock.acquire(timeout=timeout)
        if not woken:
            _CountingLock.looks += 1
        return woken

    def release(self) -> None:
        self.lock.release()


def test_once_turns_run_to_their_end_the_first_waiter_looks_about_once_a_turn(monkeypatch):
    """Every look costs the thread inside the GIL: while threads keep calling to the end of
    their turns, the first waiter sleeps until its turn is due (the hand-over wakes it),
    rather than looking every few milliseconds. Both threads still get their turns."""
    monkeypatch.setattr(gate_module, "TURN_S", 0.05)
    monkeypatch.setattr(_CountingLock, "looks", 0)
    waiter = gate_module._Waiter
    monkeypatch.setattr(gate_module, "_Waiter", lambda nap_s: waiter(nap_s, _CountingLock()))
    gate = Gate()
    stop = threading.Event()
    calls = [0, 0]

    def hammer(i: int) -> None:
        while not stop.is_set():
            gate.enter(1e-4)
            calls[i] += 1
            gate.leave()

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # about 20 turns: looking every 5 ms would be 200 looks
    stop.set()
    for thread in threads:
        thread.join(timeout=BOUND_S)
    assert not any(thread.is_alive() for thread in threads)
    assert min(calls) > 0
    assert _CountingLock.looks < 60, _CountingLock.looks


def test_a_thread_that_steps_out_between_calls_keeps_its_turn(monkeypatch):
    """A look that finds the gate open only takes it when the thread inside has been out for
    longer than a call: here it steps out for 5 ms at a time, with 500 ms calls."""
    monkeypatch.setattr(gate_module, "TURN_S", 3600.0)
    gate = Gate()
    gate.enter(0.5)
    entered = threading.Event()

    def wait() -> None:
        gate.enter(0.5)
        entered.set()
        gate.leave()

    waiting = threading.Thread(target=wait)
    waiting.start()
    while not gate._waiters:
        time.sleep(0.001)
    until = time.monotonic() + 1.5  # the waiter looks after 1 s, then every 5 ms
    while time.monotonic() < until:
        gate.leave()
        time.sleep(0.005)
        gate.enter(0.5)
    assert not entered.is_set()
    gate.leave()  # now for good: taken once out for longer than a call
    assert entered.wait(BOUND_S)
    waiting.join(timeout=BOUND_S)
