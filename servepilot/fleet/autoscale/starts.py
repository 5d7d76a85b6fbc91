"""The replicas the controller waits for, from launch until they serve: how long each has
been starting (one never ready is given up at the startup budget) and which failed.

A replica that fails to start (its backend lists it `failed`, or it is given up) is replaced:
the policy still asks for it at the next tick. One failure after another is not retried for
ever: after `retries` replacements that failed too, cold starts are held (wakes from the warm
pool go on) and the controller says why, in its log, its metrics and `status`. A broken model
path or a full disk would otherwise cost a cold start every tick."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from servepilot.fleet.backend import ReplicaState


class StartTracker:
    def __init__(self, retries: int = 1) -> None:
        self._retries = retries
        self._since: dict[str, float] = {}
        self.in_a_row = 0
        """Failed starts since the last replica that got ready."""
        self.failed = 0
        """Failed starts in all (given-up ones included)."""
        self.last_failed: tuple[str, ...] = ()
        """The failures in a row, oldest first."""

    @property
    def held(self) -> bool:
        """Cold starts are held: the replacements failed too."""
        return self.in_a_row > self._retries

    def held_line(self) -> str:
        if not self.held:
            return ""
        return (f"cold starts held: {', '.join(self.last_failed)} failed to start one after "
                "another (see their logs; restart `up` once fixed)")  # fmt: skip

    def update(self, states: Mapping[str, ReplicaState], now_s: float) -> list[str]:
        """Take the backend's word on each replica; the ids that failed since the last call.
        A replica starting is timed from when it is first seen."""
        failed: list[str] = []
        for rid, listed in states.items():
            if listed is ReplicaState.STARTING:
                self._since.setdefault(rid, now_s)
        for rid in list(self._since):
            state = states.get(rid)
            if state is ReplicaState.STARTING:
                continue
            del self._since[rid]
            if state is ReplicaState.READY:
                self.in_a_row, self.last_failed = 0, ()
            elif state in (ReplicaState.FAILED, ReplicaState.LOST):
                self._fail(rid)
                failed.append(rid)
            # Gone without a word: stopped by us, or a placeholder (a pod asked for) replaced.
        return failed

    def launched(self, rid: str, now_s: float) -> None:
        self._since.setdefault(rid, now_s)

    def stuck(self, now_s: float, timeout_s: float) -> list[str]:
        """Replicas starting for longer than `timeout_s`."""
        return [rid for rid, since in self._since.items() if now_s - since > timeout_s]

    def gave_up(self, rid: str) -> None:
        """A stuck replica was stopped: a failed start."""
        if self._since.pop(rid, None) is not None:
            self._fail(rid)

    def withdraw(self, rids: Iterable[str]) -> None:
        """Stopped on purpose while starting (the fleet shrank): no failure."""
        for rid in rids:
            self._since.pop(rid, None)

    def _fail(self, rid: str) -> None:
        self.failed += 1
        self.in_a_row += 1
        self.last_failed = (*self.last_failed, rid)
