"""What `recommend`, `report --recommend` and `tune` share on the command line: this host,
the user's llama.cpp, and the command lines a recommendation prints (shell-quoted).

Imported only by those commands when they run: it pulls in the recommender and the runner.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from specreg.text import shell_join

if TYPE_CHECKING:
    import duckdb

    from specreg.host.facts import HostFacts, HostQuery
    from specreg.host.machine import Host
    from specreg.llama.install import LlamaInstall
    from specreg.recommender.advisor import Advisor
    from specreg.recommender.recommend import Recommendation
    from specreg.registry.queries import ModelRecord
    from specreg.reports.gather import Advise


def this_host(
    query: HostQuery | None = None, con: duckdb.DuckDBPyConnection | None = None
) -> tuple[Host, HostFacts]:
    """The host the commands are for (this machine unless `query` describes another) and the
    facts the recommender predicts with: the same cores; the bandwidth doctor recorded in
    `con`'s registry when there is one."""
    from specreg.host.facts import resolve_host

    return resolve_host(query, con)


def users_llama(llama_bin: Path | None) -> LlamaInstall | None:
    """The user's llama.cpp build, or None when there is none (commands are then written for
    the pinned build's dialect and a `llama-server` on PATH)."""
    from specreg.errors import LlamaError
    from specreg.llama.install import find_llama

    try:
        return find_llama(llama_bin)
    except LlamaError:
        return None


def command_lines(
    rec: Recommendation, host: Host, install: LlamaInstall | None, top: int | None = None
) -> tuple[str, ...]:
    """The llama-server command line of each of the first `top` options, ready to paste."""
    from specreg.llama.options import option_command
    from specreg.terms import DIALECT_SPEC_TYPE

    dialect = install.dialect if install else DIALECT_SPEC_TYPE
    server: Path | str = install.server if install else "llama-server"
    out = []
    for option in rec.options if top is None else rec.options[:top]:
        try:
            out.append(shell_join(option_command(option, rec.target_path, dialect, host, server)))
        except Exception as err:  # noqa: BLE001 - e.g. a method this build's dialect lacks
            out.append(f"# not available with this llama.cpp: {err}")
    return tuple(out)


def report_advise(advisor: Advisor, host: Host, install: LlamaInstall | None) -> Advise:
    """The report's question per target and task: the best option and its command line."""

    def advise(
        con: duckdb.DuckDBPyConnection, target: ModelRecord, task: str
    ) -> tuple[Recommendation, str]:
        rec = advisor.recommend(con, target.model_id or "", task=task)
        return rec, command_lines(rec, host, install, top=1)[0]

    return advise
