"""Named errors, translated once by the CLI into a one-line message and an exit code."""

from __future__ import annotations

# Exit-code contract (documented in `specreg --help`).
EXIT_OK = 0
EXIT_FINDINGS = 1  # findings, scan errors, failed runs, drift
EXIT_USAGE = 2  # bad arguments, missing inputs
EXIT_BUSY = 3  # the host was busy: nothing was measured (host/load.py)


class SpecregError(Exception):
    """Base class: `str(err)` is a one-line message that says what to do next."""

    exit_code = EXIT_FINDINGS


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
