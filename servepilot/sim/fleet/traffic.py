"""What the simulated clients send: the level's requests as a table of token counts.

The simulator does not import the bench package (DESIGN.md's layers): a level's requests are
`load.shapes.workload_shapes` of bench's workload (same seeds), as the server sees them, and
which of them goes when is `load.slots`, the rule bench's clients follow too.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass

from servepilot.core.errors import ConfigError
from servepilot.load.slots import replay_times

NO_GROUP = -1


@dataclass(frozen=True, slots=True)
class Job:
    """One request's shape, in the tokens the server sees."""

    prompt_tokens: int
    """Everything the server prefills: prompt, chat template, conversation history."""
    output_tokens: int
    prefix_group: int | None = None
    prefix_tokens: int = 0
    """Leading tokens shared with the other jobs of `prefix_group`."""
    priority: int = 1
    session_id: str | None = None
    at_s: float | None = None
    """A trace's send time (offset from its start)."""
    routed_tokens: int | None = None
    """What the gateway estimates the prompt at (it sees the text, not the template);
    None: `prompt_tokens`."""
    tenant: str | None = None
    """Whose fair share of the gateway's queue it counts in; None: the shared one."""


class JobTable:
    """Jobs in columns of machine numbers: millions of them cost bytes each, not objects."""

    def __init__(self, jobs: Iterable[Job]) -> None:
        self.prompt = array("l")
        self.output = array("l")
        self.group = array("q")
        self.prefix = array("l")
        self.priority = array("b")
        self.routed = array("l")
        sessions: list[str | None] = []
        tenants: list[str | None] = []
        times: list[float | None] = []
        for job in jobs:
            self._append(job)
            sessions.append(job.session_id)
            tenants.append(job.tenant)
            times.append(job.at_s)
        self.sessions: list[str | None] | None = (
            sessions if any(s is not None for s in sessions) else None
        )
        self.tenants: list[str | None] | None = (
            tenants if any(t is not None for t in tenants) else None
        )
        self.at_s: list[float] | None = replay_times(times)

    def _append(self, job: Job) -> int:
        if job.prompt_tokens < 1 or job.output_tokens < 1:
            raise ConfigError("every request needs at least one prompt and one output token")
        self.prompt.append(job.prompt_tokens)
        self.output.append(job.output_tokens)
        self.group.append(NO_GROUP if job.prefix_group is None else job.prefix_group)
        self.prefix.append(job.prefix_tokens)
        self.priority.append(job.priority)
        self.routed.append(job.prompt_tokens if job.routed_tokens is None else job.routed_tokens)
        return len(self.prompt) - 1

    def add(self, job: Job) -> int:
        """One more job, made while the run goes (a session's next turn); its index. Jobs
        added so are neither replayed (no `at_s`) nor without a session."""
        index = self._append(job)
        if self.sessions is None:
            self.sessions = [None] * index
        self.sessions.append(job.session_id)
        return index

    def __len__(self) -> int:
        return len(self.prompt)

    def job(self, index: int) -> Job:
        group = self.group[index]
        return Job(
            prompt_tokens=self.prompt[index],
            output_tokens=self.output[index],
            prefix_group=None if group == NO_GROUP else group,
            prefix_tokens=self.prefix[index],
            priority=self.priority[index],
            session_id=None if self.sessions is None else self.sessions[index],
            at_s=None if self.at_s is None else self.at_s[index],
            routed_tokens=self.routed[index],
            tenant=None if self.tenants is None else self.tenants[index],
        )
