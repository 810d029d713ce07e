"""One thread at a time through a stretch of code, in turns, with no thread woken per pass.

For calls whose Python work outweighs the native work the GIL is released for: threads running
such calls side by side pass the GIL back and forth several times a call, and every pass wakes
a sleeping thread, which takes longer than the call (on two cores, two threads made half the
calls of one). Behind a gate, the thread inside runs its calls back to back while the others
sleep on locks of their own, not on the GIL, so the GIL it releases around native work wakes
nobody.

Turns: the thread inside keeps the gate while it comes back for more, until it has had it for
one turn (`TURN_S`, counted from when it got the gate or, if nobody waited then, from when the
first waiter came) while others wait; its next exit hands the gate to the first waiter. So
every thread in line gets a whole turn, and a waiter waits at most one turn per thread ahead
of it. The first waiter also looks for itself, so that a gate its last user left for good is
taken soon: after naps that grow fourfold from about two calls' time up to a quarter turn
(`NAP_CAP_S`), or, while turns run to their end, once a quarter turn after its turn is due.
Each look costs the thread inside a pass of the GIL there and back. A look takes the gate
only when it was left for longer than a call (a thread between two calls keeps its turn).
The waiters behind the first sleep until they come first (they are woken then), so a turn
costs the thread inside the same few wake-ups however many threads wait.

Turns do not always pay: where native work is most of a call, threads side by side overlap
it (a 90 us CNN made 1.8 times the calls of one thread). Side by side can only win where a
call's native part outlasts passing the GIL to a sleeping thread and back (`handoff_s`):
shorter native parts take turns without a trial (`TURNS`); for longer ones `Choice` tries
both ways on a kernel's own calls and keeps the one that made more calls a second.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

#: How long the thread inside may keep the gate while others wait. A change of thread cost
#: 0.3-0.6 ms of calls on a two-core VM (the next thread's wake-up, then its cold caches),
#: so 20 ms turns lose about 3 %; a waiter waits at most one turn per thread ahead of it.
TURN_S = 0.02
#: The longest nap of the first waiter: a gate its last user left for good is taken within this.
NAP_CAP_S = TURN_S / 4
#: Each nap of the first waiter is this many times the one before: every look costs the thread
#: inside a pass of the GIL there and back, so a turn holds few (five where naps doubled nine).
NAP_GROWTH = 4
#: The nap of a waiter behind the first, which is woken when it comes first; only a backstop.
BEHIND_NAP_S = 1.0
#: Lock round trips between two threads timed for `handoff_s`.
HANDOFF_TRIPS = 64


def _closed_lock() -> threading.Lock:
    lock = threading.Lock()
    lock.acquire()
    return lock


@dataclass(eq=False)
class _Waiter:
    #: About one call's time: a waiter that is first in line first looks for itself after twice this.
    nap_s: float
    #: Released when the gate is handed to this waiter, or when it becomes first in line (`poked`).
    wake: threading.Lock = field(default_factory=_closed_lock)
    granted: bool = False
    poked: bool = False


class Gate:
    """Lets one thread at a time in; the others wait their turn in arrival order."""

    def __init__(self) -> None:
        #: Held while a thread is inside; handed from thread to thread at a turn.
        self._inside = threading.Lock()
        self._lock = threading.Lock()  # guards the waiters; never held across a wait
        self._waiters: deque[_Waiter] = deque()
        #: When the thread inside must hand the gate to the first waiter (infinity while nobody
        #: waits; read without the lock: a stale value only moves a turn by one call).
        self._due = float("inf")
        #: When the last thread inside left it while others waited.
        self._left_at = -float("inf")
        #: Whether the first waiter looks for itself only once a turn is due (see `_first_nap`).
        self._sparse = False

    @property
    def waiting(self) -> int:
        """How many threads wait to go in."""
        return len(self._waiters)

    def enter(self, nap_s: float) -> None:
        """Return once this thread is the one inside; `nap_s`: about one call's time."""
        if (not self._waiters or time.monotonic() < self._due) and self._inside.acquire(blocking=False):
            return
        with self._lock:
            now = time.monotonic()
            if now < self._due and self._inside.acquire(blocking=False):
                return
            waiter = _Waiter(nap_s)
            self._waiters.append(waiter)
            if len(self._waiters) == 1:
                self._due = now + TURN_S
            if self._inside.acquire(blocking=False):  # open, and a waiter's turn is due: it goes first
                self._hand_over()
            first = self._waiters and self._waiters[0] is waiter
            nap = self._first_nap(waiter) if first else BEHIND_NAP_S
        self._wait(waiter, nap)

    def leave(self) -> None:
        """Let the next thread in (the thread inside calls this once per `enter`)."""
        if self._waiters:
            now = time.monotonic()
            if now >= self._due:
                with self._lock:
                    self._leave_locked()
                return
            self._left_at = now
        self._inside.release()

    def _wait(self, waiter: _Waiter, nap: float) -> None:
        try:
            while True:
                woken = waiter.wake.acquire(timeout=nap)
                with self._lock:
                    if waiter.granted:
                        return
                    if woken:  # poked: first in line now, it looks for itself soon
                        waiter.poked = False
                        nap = self._first_nap(waiter)
                        continue
                    # Left open for longer than a call (not just between two calls of a thread
                    # that comes back): the first waiter (maybe this one) goes in.
                    if time.monotonic() - self._left_at >= waiter.nap_s and self._inside.acquire(blocking=False):
                        self._sparse = False  # threads leave it mid-turn: look often
                        self._hand_over()
                        if waiter.granted:
                            return
                    first = self._waiters and self._waiters[0] is waiter
                    if not first:
                        nap = BEHIND_NAP_S
                    elif self._sparse:
                        nap = self._first_nap(waiter)
                    else:
                        nap = min(NAP_GROWTH * nap, NAP_CAP_S)
        except BaseException:  # KeyboardInterrupt in the main thread: give up the place, or the gate
            with self._lock:
                if waiter.granted:
                    self._leave_locked()
                else:
                    self._waiters.remove(waiter)
                    if self._waiters:
                        self._poke(self._waiters[0])
                    else:
                        self._due = float("inf")
            raise

    def _leave_locked(self) -> None:
        if self._waiters and time.monotonic() >= self._due:
            self._sparse = True  # its thread kept calling all turn: look once a turn
            self._hand_over()
        else:
            self._inside.release()

    def _first_nap(self, waiter: _Waiter) -> float:
        """How long the first waiter sleeps before it first looks for itself: about two calls,
        or, while turns run to their end (`_sparse`), until a quarter turn after its turn is
        due (the hand-over wakes it before). Every look costs the thread inside a pass of the
        GIL there and back (at 4 threads, looks every few ms cost 10 % of the calls)."""
        if self._sparse:
            return min(max(self._due - time.monotonic(), 0.0), TURN_S) + NAP_CAP_S
        return 2 * waiter.nap_s

    def _hand_over(self) -> None:
        """The first waiter is inside now (`_inside` stays held, on its behalf)."""
        waiter = self._waiters.popleft()
        if self._waiters:
            self._due = time.monotonic() + TURN_S
            self._poke(self._waiters[0])
        else:
            self._due = float("inf")
        waiter.granted = True
        if not waiter.poked:  # else its lock is open already
            waiter.wake.release()

    @staticmethod
    def _poke(waiter: _Waiter) -> None:
        """Wake a waiter that has just become first in line, so that it looks for itself soon
        (it slept while others were ahead of it)."""
        if not waiter.poked:
            waiter.poked = True
            waiter.wake.release()


#: Calls are tried side by side only when their native part lasts this many hand-offs or more.
#: Side by side against one thread, on two cores: 0.9 hand-offs (the example mlp), 0.47-0.64x at
#: two threads; 1.3 (an MNIST MLP), 0.6-1.1x at two threads and 0.4-0.6x at four and eight; 3.1
#: (an MNIST CNN), 1.5-1.9x.
SIDE_BY_SIDE_HANDOFFS = 2.0


class Turns:
    """The way of calls too short in native work for side by side to pay: they always take turns."""


#: See `Turns`.
TURNS = Turns()
_handoff: list[float] = []


def handoff_s() -> float:
    """What passing control to a sleeping thread costs in this process: half a lock round trip
    between two threads (the median of `HANDOFF_TRIPS`), measured at the first call."""
    if not _handoff:
        ping, pong = _closed_lock(), _closed_lock()

        def echo() -> None:
            for _ in range(HANDOFF_TRIPS):
                ping.acquire()
                pong.release()

        thread = threading.Thread(target=echo, name="portkern-handoff", daemon=True)
        thread.start()
        trips = []
        for _ in range(HANDOFF_TRIPS):
            start = time.perf_counter()
            ping.release()
            pong.acquire()
            trips.append(time.perf_counter() - start)
        thread.join()
        import statistics

        _handoff.append(statistics.median(trips) / 2)
    return _handoff[0]


def choose(native_s: float | None) -> "Choice | Turns":
    """How a kernel's short calls from several threads run: `TURNS` when their native part
    (`native_s`, None if unknown) is too short for side by side to pay, else a `Choice`."""
    if native_s is not None and native_s < SIDE_BY_SIDE_HANDOFFS * handoff_s():
        return TURNS
    return Choice(time.monotonic())


#: How long each way is tried, and for how many windows the better one then stands before
#: both are tried again (a trial spends two windows on the other way: 6 % of the time).
TRIAL_S = 0.1
KEEP_WINDOWS = 30
#: A way that wins a trial by this factor or more, as it won the one before, stands twice as
#: long as it stood last time, up to `MAX_KEEP_WINDOWS` (trials then cost under 1 % of the time).
CLEAR_WIN = 1.25
MAX_KEEP_WINDOWS = 300
#: A window counts when its calls took this many times its length (calls overlapped).
CONTENDED = 1.5
#: The way that stands is tried again at once when the calls in flight (on average as calls
#: end, over a window) become this many times more, or fewer, than during its trial (unless
#: it won clearly: turns then stand for any callers, side by side for fewer).
LEVEL_CHANGE = 1.5


class Choice:
    """Whether one kernel's calls take turns at the gate or run side by side, chosen on the
    kernel's own calls while several threads make them at once. A trial times a window of
    `TRIAL_S` each way (after a window for the switch to settle); the way that completed more
    calls a second stands for `KEEP_WINDOWS` windows (longer after repeated clear wins), or
    until the number of calls in flight changes (see `LEVEL_CHANGE`), then both are tried again. Turns win where a
    call is mostly Python work; side by side where native work, run without the GIL, is most
    of a call. Windows whose calls did not overlap count for nothing: a lone thread passes
    the gate at no cost."""

    def __init__(self, now: float) -> None:
        #: How calls run now: True, taking turns at the gate (never a collapse); False, side by side.
        self.gated = True
        # Held only to close a window, never waited for (a child forked while another thread
        # held it keeps the way it had).
        self._lock = threading.Lock()
        self._start = now
        self._calls = 0
        self._busy = 0.0
        self._callers = 0
        self._rates: dict[bool, float] = {}
        #: Calls in flight (on average, as calls ended) in each way's trial window, and in the winner's.
        self._levels: dict[bool, float] = {}
        self._level = 0.0
        self._keep = 0
        #: How many windows the last winner stood; the way that won the last trial clearly (None
        #: when it did not, or the callers changed since).
        self._span = KEEP_WINDOWS
        self._winner: bool | None = None
        self._settling = False

    def record(self, start: float, end: float, callers: int) -> None:
        """Count a call that ran from `start` to `end` (`time.monotonic()`, gate included)
        while `callers` calls (this one included) were in flight."""
        self._calls += 1
        self._busy += end - start
        self._callers += callers
        length = end - self._start
        if length < TRIAL_S or not self._lock.acquire(blocking=False):
            return
        try:
            if self._busy >= CONTENDED * length:
                self._close_window(self._calls / length, self._callers / self._calls)
            self._start, self._calls, self._busy, self._callers = end, 0, 0.0, 0
        finally:
            self._lock.release()

    def _close_window(self, rate: float, level: float) -> None:
        if self._keep:
            # Side by side loses ground as callers are added, turns do not: a clear win for
            # turns holds for any callers, one for side by side for as many callers or fewer.
            fewer = level <= self._level * LEVEL_CHANGE
            if self._winner is True or (fewer and (self._winner is False or level >= self._level / LEVEL_CHANGE)):
                self._keep -= 1
                return
            self._keep, self._winner = 0, None  # other callers now: try both ways again, from this window
        if self._settling:
            self._settling = False
        elif not self._rates:
            self._rates[self.gated], self._levels[self.gated] = rate, level
            self.gated = not self.gated
            self._settling = True
        else:
            self._rates[self.gated], self._levels[self.gated] = rate, level
            winner = max(self._rates, key=self._rates.__getitem__)
            self._level = self._levels[winner]
            clear = self._rates[winner] >= CLEAR_WIN * self._rates[not winner]
            self._span = min(2 * self._span, MAX_KEEP_WINDOWS) if clear and winner == self._winner else KEEP_WINDOWS
            self._winner = winner if clear else None
            self.gated = winner
            self._rates = {}
            self._keep = self._span
