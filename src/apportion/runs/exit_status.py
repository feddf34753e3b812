"""How a run's command ended: its exit code, or the signal that killed it."""

from __future__ import annotations

from dataclasses import dataclass
from signal import Signals


@dataclass(frozen=True, slots=True)
class ExitStatus:
    """How a run's command ended; both fields are None when it never started."""

    #: The exit code if it exited by itself, else None.
    code: int | None
    #: The number of the signal that killed it, else None.
    signal: int | None

    def __post_init__(self) -> None:
        if self.code is not None and self.signal is not None:
            raise ValueError("a process either exits or is killed, not both")

    @classmethod
    def from_returncode(cls, returncode: int) -> ExitStatus:
        """From ``Popen.returncode``, which is minus the signal for a killed process."""
        if returncode < 0:
            return cls(code=None, signal=-returncode)
        return cls(code=returncode, signal=None)

    @property
    def ok(self) -> bool:
        """True for exit code 0, the only success a command can report."""
        return self.code == 0

    def describe(self) -> str:
        """``"exit code 3"``, ``"killed by SIGKILL"`` or ``"never started"``."""
        if self.code is not None:
            return f"exit code {self.code}"
        if self.signal is not None:
            try:
                return f"killed by {Signals(self.signal).name}"
            except ValueError:
                return f"killed by signal {self.signal}"
        return "never started"


NEVER_STARTED = ExitStatus(code=None, signal=None)
