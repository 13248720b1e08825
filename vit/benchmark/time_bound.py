"""``--minutes``: a section still running at the bound is cut short (TimeBound)."""

from __future__ import annotations

import signal
import time
from contextlib import contextmanager


class TimeBound(BaseException):
    """The benchmark's --minutes ran out in a section (a BaseException, as KeyboardInterrupt is: library code
    that catches Exception, torch.compile's for one, lets it through)."""


@contextmanager
def time_bound(deadline: float | None):
    """Raise TimeBound in the main thread at ``deadline`` (time.monotonic()); no bound with None."""
    if deadline is None:
        yield
        return

    def expire(signum, frame):
        raise TimeBound

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(0.001, deadline - time.monotonic()))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
