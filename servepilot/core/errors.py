"""The one exception hierarchy of servepilot.

    ServepilotError                 anything servepilot reports to a user
    ├── ConfigError                 fleet.yaml or a flag is wrong (names the field)
    ├── ModelSourceError            the model folder or package is missing or broken
    ├── EngineError                 a vLLM replica could not be started or talked to
    │   ├── EngineStartError        carries the log tail and the probable cause
    │   └── UpstreamFailed          an HTTP exchange failed (http1/errors.py: Unreachable,
    │                               MalformedAnswer)
    └── FleetError                  up/down/status bookkeeping (state file, ports)

Upstream errors (pydantic, OSError, aiohttp) are translated into these at the boundary
where they happen, so the CLI prints one clear message and never a traceback.
"""

from __future__ import annotations


class ServepilotError(Exception):
    """Base class; `hint` says what the user can do about it."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if self.hint is None else f"{self.message}\n  hint: {self.hint}"


class ConfigError(ServepilotError):
    """A configuration file or flag holds a value servepilot cannot use."""


class ModelSourceError(ServepilotError):
    """The model cannot be found, read or converted."""


class EngineError(ServepilotError):
    """An engine replica failed."""


class EngineStartError(EngineError):
    """A replica exited or timed out before it became ready."""

    def __init__(self, message: str, *, cause: str, log_tail: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.cause = cause
        self.log_tail = log_tail

    def __str__(self) -> str:
        text = f"{self.message}\n  probable cause: {self.cause}"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        if self.log_tail:
            tail = "\n".join("    " + line for line in self.log_tail.splitlines())
            text += f"\n  last lines of the replica's log:\n{tail}"
        return text


class FleetError(ServepilotError):
    """Starting, finding or stopping a running fleet failed."""
