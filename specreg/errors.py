"""Named errors, translated once by the CLI into a one-line message and an exit code."""

from __future__ import annotations

import re
from collections.abc import Mapping

# Exit-code contract (documented in `specreg --help`).
EXIT_OK = 0
EXIT_FINDINGS = 1  # findings, scan errors, failed runs, drift
EXIT_USAGE = 2  # bad arguments, missing inputs
EXIT_BUSY = 3  # the host was busy: nothing was measured (host/load.py)


# A parameter named in a message, between private-use marks: the core says its name, a front
# end its own spelling of it (the CLI a flag, specreg.yaml a key), so one message serves both.
_OPEN, _VALUE, _CLOSE = "\ue000", "\ue002", "\ue001"
_PARAMETER = re.compile(f"{_OPEN}([^{_VALUE}{_CLOSE}]*)(?:{_VALUE}([^{_CLOSE}]*))?{_CLOSE}")


def param(name: str, value: str = "") -> str:
    """`name`, a parameter of the core (`draft`, `spec_type`, `k`), in an error message;
    `value` is what a front end that spells it as an option shows after it (PATH, N)."""
    return f"{_OPEN}{name}{_VALUE}{value}{_CLOSE}" if value else f"{_OPEN}{name}{_CLOSE}"


def spell(message: str, spelling: Mapping[str, str]) -> str:
    """`message` with each `param` as `spelling` says it (else `name`, in backquotes)."""

    def said(m: re.Match[str]) -> str:
        if m[1] not in spelling:
            return f"`{m[1]}`"
        return f"{spelling[m[1]]} {m[2]}" if m[2] else spelling[m[1]]

    return _PARAMETER.sub(said, message)


class SpecregError(Exception):
    """Base class: `str(err)` is a one-line message that says what to do next, naming the
    parameters it is about in the core's words; `spelled` names them as a front end does."""

    exit_code = EXIT_FINDINGS

    def __str__(self) -> str:
        return spell(super().__str__(), {})

    def spelled(self, spelling: Mapping[str, str]) -> str:
        """The message with each parameter as `spelling` says it (the CLI: its flags)."""
        return spell(super().__str__(), spelling)

    @property
    def parameters(self) -> tuple[str, ...]:
        """The parameters the message is about."""
        return tuple(m[1] for m in _PARAMETER.finditer(super().__str__()))


class UsageError(SpecregError):
    """The user asked for something that cannot be done as asked."""

    exit_code = EXIT_USAGE


class ModelNotFound(UsageError):
    """No model in the registry matches the given path, name or id."""


class AmbiguousModel(UsageError):
    """More than one model matches the given name."""


class FolderNotEmpty(UsageError):
    """A command that fills a folder was given one that holds other files."""


class RegistryError(SpecregError):
    """The registry database cannot be opened or is from a newer specreg."""


class GGUFError(SpecregError):
    """A file is not a GGUF that llama.cpp could load; the message names the reason."""


class LlamaError(SpecregError):
    """llama.cpp is missing, of an unknown dialect, or failed."""


class RunFailed(SpecregError):
    """A measured run failed; it has been recorded as failed."""


class HostBusy(SpecregError):
    """Other processes kept the host busy past the wait: nothing was measured or recorded."""

    exit_code = EXIT_BUSY
