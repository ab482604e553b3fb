"""Progress for the measuring commands (run, verify, tune, sweep, calibrate, agree, quality).

The core reports progress to `specreg.host.progress`; this module renders it: a rich progress
bar on stderr when stderr is a terminal, plain note lines (waits, retries and why) when it is
not, nothing under `--json` (stdout carries the document; errors still reach stderr).
`--allow-load` and `--load-wait` are measuring options (`common.settings_options`): the core
turns them into the `LoadPolicy` it measures under (`Settings.load_policy`), with this host's
quiet noise floor from the registry (`specreg calibrate` measures it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from specreg.cli.common import err_console

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from specreg.cli.common import SafeConsole


class _Task:
    def __init__(self, bar: Progress | None, task_id: TaskID | None, description: str):
        self.bar = bar
        self.task_id = task_id
        self.description = description

    def advance(self, n: int = 1, *, detail: str | None = None) -> None:
        if self.bar is None or self.task_id is None:
            return
        text = f"{self.description}: {detail}" if detail else self.description
        self.bar.update(self.task_id, advance=n, description=text)


class TerminalProgress:
    """A `specreg.host.progress.Listener` drawing on stderr: a bar per task when stderr is a
    terminal (`live`), note lines always."""

    def __init__(self, console: SafeConsole, *, live: bool):
        self.console = console
        self.live = live
        self.bar: Progress | None = None
        self.open = 0

    def _bar(self) -> Progress:
        if self.bar is None:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )

            self.bar = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            )
            self.bar.start()
        return self.bar

    def start(self, description: str, total: int | None) -> _Task:
        if not self.live:
            return _Task(None, None, description)
        bar = self._bar()
        self.open += 1
        return _Task(bar, bar.add_task(description, total=total), description)

    def finish(self, task: Any) -> None:
        if not isinstance(task, _Task) or task.bar is None or task.task_id is None:
            return
        task.bar.remove_task(task.task_id)
        self.open -= 1
        if self.open <= 0 and self.bar is not None:
            self.bar.stop()
            self.bar = None

    def note(self, message: str) -> None:
        target = self.bar.console if self.bar is not None else self.console
        target.print(f"note: {message}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


class _Silent:
    def start(self, description: str, total: int | None) -> _Task:
        return _Task(None, None, description)

    def finish(self, task: Any) -> None:
        pass

    def note(self, message: str) -> None:
        pass


@contextmanager
def measuring(*, as_json: bool = False) -> Iterator[None]:
    """The block's progress, shown (none under --json); the core measures under its own load
    policy (`Settings.load_policy`)."""
    from specreg.host.progress import listening

    console = err_console()
    listener: TerminalProgress | _Silent = (
        _Silent() if as_json else TerminalProgress(console, live=console.is_terminal)
    )
    with listening(listener):
        try:
            yield
        finally:
            if isinstance(listener, TerminalProgress):
                listener.close()
