"""What a doctor rule reports: a finding names its evidence and the fix, with the fleet.yaml
knob and its new value where one applies."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Severity(enum.StrEnum):
    PROBLEM = "problem"
    """Something is wrong now: requests fail, wait or slow down because of it."""
    WARNING = "warning"
    """It will bite under more load, or it makes a tool read wrong numbers."""
    INFO = "info"


@dataclass(frozen=True, slots=True)
class Finding:
    rule: str
    severity: Severity
    summary: str
    evidence: str
    """What was seen, where: the log line, the metric and its value, the environment fact."""
    fix: str
    knob: str | None = None
    """The fleet.yaml path to change (`engine.max_num_seqs`), when one is the fix."""
    value: str | None = None
    """Its new value."""

    def as_dict(self) -> dict[str, str | None]:
        return {
            "rule": self.rule,
            "severity": self.severity.value,
            "summary": self.summary,
            "evidence": self.evidence,
            "fix": self.fix,
            "knob": self.knob,
            "value": self.value,
        }
