"""Tables that name models for choosing, fitted to the terminal (issue 25).

A user picks a model from `models`, `drafts` or `recommend` by typing its id, so the id is
never cut; two quants of one model share a name, so the file name (which carries the quant)
stands under the name. When the terminal is narrow the name is cut first (one line each for
the name and the file, ending in `…`), then the columns that matter least are left out and
the table says which ones, so no cell wraps a model name over three to five lines.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from rich.cells import cell_len, set_cell_size
from rich.measure import Measurement
from rich.text import Text

from specreg.text import clip, terminal_safe

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderResult
    from rich.table import Table

# How many characters of a model id the tables show: unique in any real registry, and what
# every command accepts as an id prefix.
ID_WIDTH = 10
# A name column narrower than this says too little: columns are left out before that.
MIN_NAME_WIDTH = 20
# Between two columns: a space of padding and the (blank) separator.
GAP = 2


def short_id(model_id: str) -> str:
    return model_id[:ID_WIDTH]


class Lines:
    """A cell of several lines, each cut to the column's width, never wrapped: a name loses its
    end, a file name its middle (its end names the quant). One `Text` per line: the console
    escapes a newline inside a `Text` as it would one from a file."""

    def __init__(
        self, lines: Sequence[str], *, middle: Sequence[bool] = (), wrap_first: bool = False
    ) -> None:
        self.lines = tuple(lines)
        self.middle = tuple(middle) + (False,) * (len(self.lines) - len(middle))
        self.wrap_first = wrap_first  # a configuration wraps: every word of it counts

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for i, (line, middle) in enumerate(zip(self.lines, self.middle, strict=True)):
            if i == 0 and self.wrap_first:
                yield Text(terminal_safe(line), no_wrap=False, overflow="fold")
            else:
                yield Text(cut(terminal_safe(line), options.max_width, middle=middle), no_wrap=True)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        widest = max((cell_len(terminal_safe(line)) for line in self.lines), default=0)
        return Measurement(min(widest, 8), widest)


def cut(text: str, width: int, *, middle: bool = False) -> str:
    """`text` in at most `width` cells, `…` where it was cut (its middle if `middle`)."""
    if cell_len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    if not middle:
        return set_cell_size(text, width - 1).rstrip() + "…"
    tail = (width - 1) // 2
    head = width - 1 - tail
    return set_cell_size(text, head).rstrip() + "…" + set_cell_size(text[::-1], tail)[::-1]


Cell = str | Text | Lines


def model_cell(
    name: str, path: str | None = None, *, first: str | None = None, model_id: str | None = None
) -> Lines:
    """A model as it is chosen: `first` (a configuration, say) on its own line, the name (after
    its id, which a name column of `MIN_NAME_WIDTH` never cuts), then the file name (which
    carries the quant)."""
    lines = [first] if first else []
    lines.append(f"{short_id(model_id)} {clip(name)}" if model_id else clip(name))
    if path:
        lines.append(clip(os.path.basename(path)))
    return Lines(lines, middle=[False] * (len(lines) - 1) + [bool(path)], wrap_first=bool(first))


def _width(cell: Cell) -> int:
    lines = (
        cell.lines if isinstance(cell, Lines) else (cell.plain if isinstance(cell, Text) else cell,)
    )
    return max((cell_len(terminal_safe(line)) for line in lines), default=0)


@dataclass
class Column:
    """One column and its cells. `flexible`: the model-name column, given what the others
    leave. `wrap`: free text (reasons), wrapped in what is left after the name, at least
    `min_width` wide. `drop`: left out at narrow widths, lowest first; None: always shown."""

    header: str
    cells: Sequence[Cell] = ()
    flexible: bool = False
    wrap: bool = False
    min_width: int = 12
    drop: int | None = None
    justify: Literal["left", "right"] = "left"

    @property
    def width(self) -> int:
        return max([cell_len(self.header), *map(_width, self.cells)])


def _room(kept: Sequence[Column], width: int) -> int:
    """What the fixed columns leave for the name and the wrapped text."""
    fixed = sum(c.width for c in kept if not (c.flexible or c.wrap))
    return width - fixed - GAP * (len(kept) - 1) - 1  # the last column's padding


def fitted_table(
    columns: Sequence[Column], width: int, **table_args: Any
) -> tuple[Table, list[str]]:
    """A table of `columns` at most `width` wide, and the headers of the columns it left out
    to give the name column `MIN_NAME_WIDTH` (say so under the table)."""
    from rich import box
    from rich.table import Table

    kept = list(columns)
    dropped: list[str] = []
    wrap_min = sum(min(c.min_width, c.width) for c in columns if c.wrap)
    for col in sorted((c for c in kept if c.drop is not None), key=lambda c: c.drop or 0):
        if _room(kept, width) - wrap_min >= MIN_NAME_WIDTH:
            break
        kept.remove(col)
        dropped.append(col.header)
    room = _room(kept, width)
    names = [c for c in kept if c.flexible]
    share = (room - wrap_min) // max(len(names), 1)  # two name columns (audit's pairs) halve it
    name_width = max(MIN_NAME_WIDTH, min(max((c.width for c in names), default=0), share))
    wraps = [c for c in kept if c.wrap]
    # each wrapped column gets its minimum, then what is left in the order of the columns
    extra = max(room - name_width * len(names), 0) - sum(min(c.min_width, c.width) for c in wraps)
    table = Table(
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
        header_style="bold",
        **table_args,
    )
    for c in kept:
        if c.flexible:
            table.add_column(c.header, no_wrap=True, width=min(c.width, name_width))
        elif c.wrap:
            least = min(c.min_width, c.width)
            share = least + max(min(c.width - least, extra), 0)
            extra -= share - least
            table.add_column(c.header, overflow="fold", width=share)
        else:
            table.add_column(c.header, no_wrap=True, min_width=c.width, justify=c.justify)
    n_rows = max((len(c.cells) for c in kept), default=0)
    for i in range(n_rows):
        table.add_row(*(c.cells[i] if i < len(c.cells) else "" for c in kept))
    return table, dropped


def left_out_note(dropped: Sequence[str]) -> str | None:
    """The line under a fitted table naming the columns it left out, if any."""
    if not dropped:
        return None
    return f"({', '.join(dropped)} left out at this width: a wider terminal or --json shows them)"
