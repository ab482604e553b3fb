"""What specreg starts on the user's desktop: a file opened in its default application."""

from __future__ import annotations

from pathlib import Path

import click


def open_in_browser(path: Path) -> None:
    """Open `path` with the desktop's default application (`report --open`): click's
    launcher (xdg-open, open, or start), which returns once it has handed the file over."""
    click.launch(str(path))
