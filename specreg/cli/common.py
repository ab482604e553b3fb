"""Options and output helpers shared by every command.

Everything a command shows goes through these helpers, never `click.echo` or `print` (a test
holds every module of this package to that):

- `console()` / `err_console()`: a `SafeConsole`, which makes every piece of text it renders
  terminal-safe (`specreg.text.terminal_safe`) and cuts any one string to `TEXT_LIMIT`
  characters. Text reaches a terminal through rich in exactly two forms, a `str` (turned into
  `Text` by `render_str`) or a `Text`, and every table cell, title, message and progress label
  is one of them; the console escapes at those two points, below every renderable, so no table
  or message written tomorrow can forget it. Markup and emoji codes are off: `[red]` or
  `:smile:` in a model name prints as written. Styles stay where they carry no data (header
  and column styles, given as `style=`).
- `emit(result)`: the exact `--json` document a result's `to_json()` builds. JSON already
  escapes C0 controls; C1 controls, bidi controls and lone surrogates are written as `\\uXXXX`
  too, which parses back to the same value, so `--json` stays exact and is safe on a terminal.
- `write_output(text)`: a machine document (a script, GraphML) on stdout, as the target format
  escaped it.
"""

from __future__ import annotations

import functools
import json
import math
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment
from rich.text import Span, Text

from specreg.jsonout import JsonResult
from specreg.terms import (
    DEFAULT_N_PREDICT,
    DEFAULT_REPEATS,
    DEFAULT_RETRIES,
    ENGINE_AUTO,
    ENGINES,
    STARTUP_TIMEOUT_S,
)
from specreg.text import ABOVE_C0, SURROGATES, TEXT_LIMIT, clip, terminal_safe
from specreg.units import (
    MAX_BANDWIDTH_GBS,
    MAX_CORES,
    MAX_CTX,
    MAX_MEMORY_BYTES,
    MAX_SLOTS,
    MAX_TEMPERATURE,
    MAX_THREADS,
    parse_size,
)

if TYPE_CHECKING:
    import duckdb

    from specreg.auditor.rules import RuleSet

F = TypeVar("F", bound=Callable[..., Any])


# Where the group's own `--db` (`specreg --db FILE models`) waits for the command's.
DB_META = "specreg.db"


def _group_db(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """A command's --db, else the one given before the command (`specreg --db FILE CMD`)."""
    return value if value is not None else ctx.meta.get(DB_META)


def db_option(func: F) -> F:
    return click.option(
        "--db",
        "db_path",
        type=FILE,
        default=None,
        callback=_group_db,
        help="Registry database (default: $SPECREG_HOME/registry.duckdb).",
    )(func)


def json_option(func: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")(func)


def resolve_db(db_path: Path | None) -> Path:
    from specreg.home import default_db_path

    return db_path if db_path is not None else default_db_path()


# --- machine output ----------------------------------------------------------------------

# Characters JSON leaves raw with ensure_ascii=False that a terminal may act on, or that
# cannot be encoded at all (lone surrogates from undecodable file names).
_JSON_UNSAFE = re.compile(f"[{ABOVE_C0}{SURROGATES}]")


def json_text(doc: dict[str, Any]) -> str:
    """`doc` as indented JSON, readable (non-ASCII kept) and terminal-safe: the characters a
    terminal acts on are `\\uXXXX` escapes, which parse back to the same string."""
    from specreg.jsonout import plain

    text = json.dumps(plain(doc), indent=2, ensure_ascii=False, allow_nan=False)
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def emit(result: JsonResult) -> None:
    """Write a result's own versioned `--json` document to stdout."""
    emit_document(result.to_json())


def emit_document(doc: dict[str, Any]) -> None:
    """Write a document a result built (`result.to_json(...)` with arguments) to stdout."""
    sys.stdout.write(json_text(doc) + "\n")


def present(result: JsonResult, as_json: bool, render: Callable[[Any], None]) -> None:
    """The result's own `--json` document, or `render(result)` for people."""
    if as_json:
        emit(result)
    else:
        render(result)


def write_output(text: str) -> None:
    """A machine document (shell script, YAML, INI, GraphML) on stdout, exactly as rendered.
    Its renderer escapes untrusted text for its own format; none leaves a raw control."""
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


# --- human output ------------------------------------------------------------------------


def safe_text(text: Text) -> Text:
    """`text` with its characters made terminal-safe and its styles kept on the same spans."""
    if terminal_safe(text.plain) == text.plain:
        return text
    starts = [0]  # where each old character starts in the escaped text
    pieces = []
    for ch in text.plain:
        piece = terminal_safe(ch)
        pieces.append(piece)
        starts.append(starts[-1] + len(piece))
    safe = text.blank_copy("".join(pieces))  # the style, justify, overflow, ... of `text`
    safe.spans = [Span(starts[s.start], starts[s.end], s.style) for s in text.spans]
    return safe


class SafeConsole(Console):
    """A rich Console that renders untrusted text visibly escaped and cut to `limit`.

    `limit=None` shows whole strings (`show --full`); escaping always happens.
    """

    def __init__(self, *, limit: int | None = TEXT_LIMIT, **kwargs: Any) -> None:
        kwargs.setdefault("soft_wrap", True)  # a long line (a command to paste) stays one line
        super().__init__(markup=False, emoji=False, highlight=False, **kwargs)
        self.limit = limit

    def render_str(self, text: str, **kwargs: Any) -> Text:
        kwargs.update(markup=False, emoji=False, highlight=False)
        return super().render_str(terminal_safe(clip(text, self.limit)), **kwargs)

    def render(
        self, renderable: RenderableType, options: ConsoleOptions | None = None
    ) -> Iterable[Segment]:
        if isinstance(renderable, Text):
            renderable = safe_text(renderable)
        return super().render(renderable, options)


def _width() -> int | None:
    # Piped output keeps whole rows instead of rich's default 80 columns.
    return None if sys.stdout.isatty() else 200


def console(*, full: bool = False) -> SafeConsole:
    """stdout for people. `full`: no cut on long strings (`show --full`)."""
    return SafeConsole(width=_width(), limit=None if full else TEXT_LIMIT)


def err_console() -> SafeConsole:
    """stderr for people: progress, notes, errors."""
    return SafeConsole(stderr=True)


# --- option types: a bad value is a usage error (exit 2, one line) -----------------------


class ModelRef(click.ParamType):
    """A model by path, id prefix or name: anything `queries.resolve_model` takes, not blank.
    An alias the working folder's specreg.yaml declares stands for its model's id."""

    name = "model"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        if not text.strip():
            self.fail("empty: give a path, an id from `specreg models`, or a name", param, ctx)
        return declared_id(text) or text


def declared_id(ref: str, spec_path: Path | None = None) -> str | None:
    """The id of the model specreg.yaml (default: the working folder's) declares with the alias
    `ref`, compared as model names are (`queries.name_key`: case, spaces, hyphens, underscores
    ignored); None when no alias is `ref` (or two models share it), `ref` is a file, or there is
    no valid specreg.yaml (`specreg plan` is where a broken one is reported)."""
    from specreg.declare import SPEC_FILENAME
    from specreg.registry.queries import name_key

    path = spec_path or Path(SPEC_FILENAME)
    try:
        if not path.is_file() or Path(ref).exists():
            return None
        mtime = path.stat().st_mtime_ns
    except (OSError, ValueError):  # a name too long or odd to be a path is a name
        return None
    return _declared_aliases(path.resolve(), mtime).get(name_key(ref))


@functools.lru_cache(maxsize=4)
def _declared_aliases(path: Path, mtime_ns: int) -> dict[str, str]:
    """`name_key(alias)` -> model id for every alias of specreg.yaml at `path` (as of
    `mtime_ns`) that names one model."""
    from specreg.declare.spec import load_spec
    from specreg.errors import SpecregError
    from specreg.registry.queries import name_key

    try:
        spec, _ = load_spec(path)
    except (SpecregError, OSError, ValueError):
        return {}
    ids: dict[str, set[str]] = {}
    for model in spec.models:
        for alias in model.aliases:
            ids.setdefault(name_key(alias), set()).add(model.id)
    return {key: next(iter(found)) for key, found in ids.items() if key and len(found) == 1}


class FiniteFloat(click.ParamType):
    """A finite number of at least `min` and at most `max` (temperatures, bandwidths)."""

    name = "number"

    def __init__(self, min: float = 0.0, max: float | None = None) -> None:
        self.min = min
        self.max = max

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number) or number < self.min:
            self.fail(f"{value} is not a number of at least {self.min:g}", param, ctx)
        if self.max is not None and number > self.max:
            self.fail(f"{value} is not a number from {self.min:g} to {self.max:g}", param, ctx)
        return number


class ByteSize(click.ParamType):
    """A size like 16G, 512MB or 1.5GiB (GB: 10^9 bytes, GiB: 2^30; `specreg.units`), at
    most `most` bytes; the command gets bytes."""

    name = "size"

    def __init__(self, most: int = MAX_MEMORY_BYTES) -> None:
        self.most = most

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        from specreg.registry.queries import human_bytes

        try:
            size = parse_size(str(value))
        except ValueError:
            self.fail(f"{value!r} is not a size such as 16G, 512M or 1.5GiB", param, ctx)
        if size > self.most:
            self.fail(f"{value} is more than {human_bytes(self.most)}, past any host", param, ctx)
        return size


_COUNT_UNITS = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}


class ParamCount(click.ParamType):
    """A parameter count like 500M, 1.5B or 7000000000 (not negative)."""

    name = "count"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().upper()
        scale = _COUNT_UNITS.get(text[-1:], 1.0)
        try:
            number = float(text[:-1] if text[-1:] in _COUNT_UNITS else text) * scale
        except ValueError:
            number = math.nan
        if not math.isfinite(number) or number < 0:
            self.fail(f"{value!r} is not a parameter count like 500M or 32B", param, ctx)
        return int(number)


class TaskChoice(click.Choice):
    """A task or one of its aliases (`general` is chat), the same words in every command; the
    command gets the canonical task, and stderr says what an alias maps to."""

    def __init__(self) -> None:
        from specreg.terms import TASK_CHOICES

        super().__init__(TASK_CHOICES)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from specreg.terms import canonical_task

        name = str(super().convert(value, param, ctx))
        task = canonical_task(name)
        if task != name:
            err_console().print(f"note: task {name} is {task} (its prompts and predictions)")
        return task


class SpecStack(click.ParamType):
    """--spec-type: one llama.cpp speculative type or a comma list of them (a stack), checked by
    the pinned build's rules (specreg.stacks); the command gets it in the order llama.cpp tries
    the types, and stderr says so when that differs from what was typed."""

    name = "type[,type...]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from specreg.stacks import StackError, parse_stack, reordered

        try:
            stack = parse_stack(str(value))
        except StackError as err:
            self.fail(str(err), param, ctx)
        if reordered(str(value), stack):
            err_console().print(f"note: llama.cpp tries the types in this order: {stack.spelled}")
        return stack.spelled


class TypeK(click.ParamType):
    """--type-k TYPE=N: the K of one type of a stack."""

    name = "type=k"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, int]:
        if isinstance(value, tuple):
            return value
        name, _, k = str(value).partition("=")
        if not name or not k.isdigit() or int(k) < 1:
            self.fail(
                f"{value!r}: write TYPE=K with K of at least 1, e.g. ngram-mod=16", param, ctx
            )
        return name.strip(), int(k)


class Address(click.ParamType):
    """An address to listen on: an IP address, `localhost` or a host name (RFC 1123)."""

    name = "address"
    _LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        import ipaddress

        text = str(value).strip()
        try:
            return str(ipaddress.ip_address(text.strip("[]")))
        except ValueError:
            pass
        labels = text.rstrip(".").split(".")
        named = len(text) <= 253 and all(self._LABEL.match(label) for label in labels)
        if not named or labels[-1].isdigit():  # 999.1.1.1 is no name and no IPv4 address
            self.fail(
                f"{value!r} is not an IP address or a host name (e.g. 127.0.0.1, 0.0.0.0, ::1)",
                param,
                ctx,
            )
        return text


MODEL = ModelRef()
ADDRESS = Address()
TEMPERATURE = FiniteFloat(0.0, MAX_TEMPERATURE)
# Bounds past which no host or model goes (specreg.units): a usage error before anything starts.
FILE = click.Path(dir_okay=False, path_type=Path)  # a file's path, not a folder's
PORT = click.IntRange(1, 65535)
CTX = click.IntRange(1, MAX_CTX)
SLOTS = click.IntRange(1, MAX_SLOTS)
THREADS = click.IntRange(1, MAX_THREADS)
# As specreg.yaml bounds them (declare/spec.py): drafted tokens per step, experts per token.
DRAFT_K = click.IntRange(1, 256)
EXPERTS = click.IntRange(1, 1024)
SEED = click.IntRange(0, 2**32 - 1)  # llama.cpp's seed is 32 bits
CORES = click.IntRange(1, MAX_CORES)
SIZE = ByteSize()
PARAM_COUNT = ParamCount()
SPEC_STACK = SpecStack()
TYPE_K = TypeK()


# --- measurement options: each defined once, its default from specreg.terms ---------------

POSITIVE = click.IntRange(min=1)

# The measuring options by the field of specreg.runner.settings.Settings each one sets: the
# option's declarations and its click settings (a command may change its default or help).
_MEASURING: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "n_predict": (
        ("--n-predict",),
        dict(type=POSITIVE, default=DEFAULT_N_PREDICT, show_default=True,
             help="Tokens generated per prompt in each timed sample."),
    ),
    "repeats": (
        ("--repeat", "repeats"),
        dict(type=POSITIVE, default=DEFAULT_REPEATS, show_default=True,
             help="Timed samples of each prompt."),
    ),
    "retries": (
        ("--retries",),
        dict(type=click.IntRange(min=0), default=DEFAULT_RETRIES, show_default=True,
             help="Measure a sample again up to N times when other processes took CPU during "
             "it."),
    ),
    "threads": (
        ("--threads",),
        dict(type=THREADS, default=None, help="llama.cpp threads (default: physical cores)."),
    ),
    "startup_timeout": (
        ("--timeout", "startup_timeout"),
        dict(type=FiniteFloat(min=1.0), default=STARTUP_TIMEOUT_S, show_default=True,
             help="Seconds llama-server may take to load the models and answer."),
    ),
    "engine": (
        ("--engine",),
        dict(type=click.Choice(ENGINES), default=ENGINE_AUTO, show_default=True,
             help="llama-server, or the legacy llama-speculative/llama-lookup (auto: legacy "
             "only when this llama-server lacks the method)."),
    ),
    "warm_first": (
        ("--warm", "warm_first"),
        dict(type=POSITIVE, default=None, metavar="N",
             help="Warm regime: send the distinct prompts once each, in order, to one "
             "llama-server and report those after the first N apart (what a long-lived server "
             "learns; never a replay)."),
    ),
    "allow_load": (
        ("--allow-load",),
        dict(is_flag=True,
             help="Measure even when other processes keep the CPU busy; such a run is recorded "
             "as disturbed: kept and shown, never evidence for recommend, tune, train or "
             "propose."),
    ),
    "load_wait": (
        ("--load-wait",),
        dict(type=FiniteFloat(min=0.0), default=None, metavar="SECONDS",
             help="How long to wait for a busy host to quiet down before refusing (exit 3); 0 "
             "refuses at once. Default 60 ($SPECREG_LOAD_WAIT)."),
    ),
}  # fmt: skip
# `load`: the load guard's two options, for every command that measures
_GROUPS = {"load": ("allow_load", "load_wait")}


def measuring_option(name: str, **changes: Any) -> Callable[[F], F]:
    """The measuring option that sets `Settings.<name>`, with a command's own `changes` (its
    default, its help), for a command that takes it on its own."""
    decls, kw = _MEASURING[name]
    return click.option(*decls, **{**kw, **changes})


def option_group(name: str, make: Callable[[dict[str, Any]], Any], *options: Any) -> Any:
    """A decorator: `options` (click options and arguments) gathered into ONE argument `name`,
    which `make` builds from their values (by parameter name); the command never sees them one
    by one. Options listed first show first in --help."""

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def command(*args: Any, **kwargs: Any) -> Any:
            given = {p: kwargs.pop(p) for p in params}
            return func(*args, **{name: make(given)}, **kwargs)

        before = len(getattr(command, "__click_params__", ()))
        for option in reversed(options):
            command = option(command)
        params = [p.name for p in command.__click_params__[before:]]  # type: ignore[attr-defined]
        return command  # type: ignore[return-value]

    return decorate


def option_stack(*options: Callable[[F], F]) -> Callable[[F], F]:
    """One decorator for `options` (click options, arguments and option decorators), shown in
    --help in the order given."""

    def decorate(func: F) -> F:
        for option in reversed(options):
            func = option(func)
        return func

    return decorate


def settings_options(*names: str, **changes: dict[str, Any]) -> Any:
    """The measuring options `names` (fields of `specreg.runner.settings.Settings`, in the
    order --help shows them; `load` is --allow-load and --load-wait) gathered into ONE
    argument: the command gets `settings`, a Settings built here, and passes it whole.
    `changes` give an option the command's own default or help, e.g.
    `repeats={"default": 2}`; an option not named keeps the Settings default."""
    fields = [f for n in names for f in _GROUPS.get(n, (n,))]

    def settings(given: dict[str, Any]) -> Any:
        from specreg.runner.settings import Settings

        return Settings(**given)

    options = [measuring_option(f, **changes.get(f, {})) for f in fields]
    return option_group("settings", settings, *options)


def server_arg_option(func: F | None = None) -> Any:
    """`--server-arg ARGS` (repeatable): llama-server flags of the user's own, after
    specreg's; a flag specreg sets itself is a usage error (specreg.llamacpp)."""
    option = click.option(
        "--server-arg",
        "server_args",
        multiple=True,
        metavar="ARGS",
        help="llama-server flags of your own, after specreg's, e.g. --server-arg=--mlock or "
        "--server-arg '--cache-type-k q8_0' (repeatable); not the ones specreg sets (-m, -c, "
        "-t, -np, --port, the speculative flags: their own options say them).",
    )
    return option if func is None else option(func)


def prompts_options() -> list[Any]:
    """--task, --prompts and --max-prompts: the prompts a run or a sweep measures (for an
    `option_group`, whose maker hands their values to `prompts_of`)."""
    return [
        task_option,
        click.option(
            "--prompts",
            "prompts_file",
            type=FILE,
            help='Your own prompts, JSONL lines like {"id": "a", "prompt": "..."}.',
        ),
        click.option(
            "--max-prompts", type=POSITIVE, default=None, help="Use only the first N prompts."
        ),
    ]


def prompts_of(given: dict[str, Any]) -> Any:
    """The `specreg.runner.workload.Prompts` the `prompts_options` asked for."""
    from specreg.runner.workload import Prompts

    return Prompts(given.pop("tasks"), given.pop("prompts_file"), given.pop("max_prompts"))


def task_option(
    func: F | None = None,
    *,
    multiple: bool = True,
    default: str | None = None,
    required: bool = False,
    help: str = "Task prompt set (repeatable; default: every task).",
) -> Any:
    """`--task`: a task or an alias of one (TaskChoice), the same words in every command.
    `multiple` (the default) gives the command `tasks`, a tuple; else `task`, one name."""
    option = click.option(
        "--task",
        "tasks" if multiple else "task",
        type=TaskChoice(),
        multiple=multiple,
        default=default,
        required=required,
        show_default=default is not None,
        help=help,
    )
    return option if func is None else option(func)


def threads_option(func: F | None = None, **changes: Any) -> Any:
    """`--threads N` (at least 1; None: llama.cpp's own choice, the physical cores), for a
    command that takes no other measuring option."""
    option = measuring_option("threads", **changes)
    return option if func is None else option(func)


def n_predict_option(func: F | None = None, **changes: Any) -> Any:
    """`--n-predict N`, for a command that takes no other measuring option (`agree` states its
    own default: it generates longer texts)."""
    option = measuring_option("n_predict", **changes)
    return option if func is None else option(func)


# --- the host a command predicts for ------------------------------------------------------

BANDWIDTH = FiniteFloat(min=0.001, max=MAX_BANDWIDTH_GBS)


def _host_query(given: dict[str, Any]) -> Any:
    from specreg.host.facts import HostQuery

    return HostQuery(given["bandwidth"], given["cores"], given["host_facts"], given["memory"])


# `--host-facts FILE`, `--cores N`, `--bandwidth GB/s` and `--memory SIZE`: the host a command
# predicts for (default: this machine, $SPECREG_HOST_FACTS honoured), handed to the command as
# one `host_query` (specreg.host.facts.HostQuery). The same facts give the speed model its
# cores, the printed commands their `-t`, and the advice what fits in memory.
host_facts_options = option_group(
    "host_query",
    _host_query,
    click.option(
        "--host-facts",
        type=FILE,
        default=None,
        help="Predict for the host these facts describe: a JSON object in the syntax of "
        "$SPECREG_HOST_FACTS (Host fields and bandwidth_gbs), or `specreg doctor --json` "
        "output saved on that host.",
    ),
    click.option(
        "--cores",
        type=CORES,
        default=None,
        metavar="N",
        help="Physical cores of the host to predict for (and -t in the commands).",
    ),
    click.option(
        "--bandwidth",
        type=BANDWIDTH,
        default=None,
        metavar="GB/s",
        help="Memory bandwidth in GB/s (default: the facts' own, else what specreg doctor "
        "measured on this host, else one stored estimate).",
    ),
    click.option(
        "--memory",
        type=SIZE,
        default=None,
        metavar="SIZE",
        help="Memory of the host to predict for, e.g. 768G (GB: 10^9 bytes), which decides "
        "what fits (default: the facts' own, else this machine's).",
    ),
)


# --- which llama.cpp's rules -------------------------------------------------------------


LLAMA_BIN_HELP = "Folder with llama.cpp's binaries (default: $SPECREG_LLAMA_BIN, PATH, the cache)."


def llama_bin_option(func: F | None = None, *, help: str = LLAMA_BIN_HELP) -> Any:
    """`--llama-bin DIR`: the llama.cpp to run (the usual search order otherwise). Used bare
    (`@llama_bin_option`) or with a command's own help (`@llama_bin_option(help=...)`)."""
    option = click.option(
        "--llama-bin", type=click.Path(file_okay=False, path_type=Path), default=None, help=help
    )
    return option if func is None else option(func)


def build_option(func: F) -> F:
    func = llama_bin_option(
        func,
        help="Apply the rules of the llama.cpp build in this folder (also $SPECREG_LLAMA_BIN).",
    )
    return click.option(
        "--llama-build",
        type=click.IntRange(min=0),
        default=None,
        help="Apply the rules of this llama.cpp build number (default: the pinned build).",
    )(func)


def rules_option(func: F) -> F:
    """`--llama-build N` and `--llama-bin DIR` as the one thing a command wants of them: the
    auditor's `rules` for that llama.cpp (`llama_rules`)."""

    def rules(given: dict[str, Any]) -> RuleSet:
        return llama_rules(given["llama_build"], given["llama_bin"])

    return option_group("rules", rules, build_option)(func)


def llama_rules(llama_build: int | None, llama_bin: Path | None) -> RuleSet:
    """The auditor's rules for the user's llama.cpp when specreg knows its build (a build
    number, or a build found in --llama-bin / $SPECREG_LLAMA_BIN), else the pinned build's."""
    import os

    from specreg import auditor

    if llama_build is not None:
        return auditor.rules_for_build(llama_build)
    if llama_bin is None and not os.environ.get("SPECREG_LLAMA_BIN"):
        return auditor.PINNED_RULES
    from specreg.llama.install import find_llama

    install = find_llama(llama_bin)
    return auditor.rules_for_version(install.version, install.dialect)


def resolve_model_path(con: duckdb.DuckDBPyConnection, ref: str) -> Path:
    """The file of the model `ref` names (a path, an id prefix or a name), as the runner opens
    it (`specreg.runner.runs.model_file`)."""
    from specreg.runner.runs import model_file

    return model_file(con, ref)
