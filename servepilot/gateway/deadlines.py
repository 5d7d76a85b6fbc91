"""The request timeout of every upstream exchange in flight, on one timer.

A timer per request (`loop.call_later`, then `cancel` when the answer is in) is an allocation
and two heap operations in the event loop per request, for a timeout that almost never fires.
Every exchange has the same timeout, so deadlines fall due in the order the exchanges started:
the exchanges in flight are kept in that order (a dict: O(1) to add and to drop), and one
timer waits for the oldest one's deadline. When it fires, the exchanges past their deadline
expire and it is armed again for the oldest left; an exchange that ended is simply no longer
there. No deadline is ever acted on late: the armed timer is never later than any deadline
in the dict.
"""

from __future__ import annotations

import asyncio
from typing import Protocol


class Expirable(Protocol):
    def expire(self) -> None:
        """Its deadline passed: give up on it."""
        ...


class Deadlines:
    """`add` an exchange when it starts, `discard` it when it ends; `expire()` is called on
    those still there `timeout_s` after their start."""

    __slots__ = ("_due", "_loop", "_timeout_s", "_timer")

    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._due: dict[Expirable, float] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __len__(self) -> int:
        return len(self._due)

    def add(self, item: Expirable, loop: asyncio.AbstractEventLoop) -> None:
        due_s = loop.time() + self._timeout_s
        self._due[item] = due_s
        if self._timer is None:
            self._loop = loop
            self._timer = loop.call_at(due_s, self._fire)

    def discard(self, item: Expirable) -> None:
        self._due.pop(item, None)

    def _fire(self) -> None:
        self._timer = None
        loop = self._loop
        assert loop is not None
        now_s = loop.time()
        due = self._due
        while due:
            item, due_s = next(iter(due.items()))
            if due_s > now_s:
                self._timer = loop.call_at(due_s, self._fire)
                return
            del due[item]
            item.expire()
