"""`specreg lookup-cache build|list`: static n-gram caches from the user's own workload."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from specreg.cli.common import (
    FILE,
    MODEL,
    POSITIVE,
    console,
    db_option,
    json_option,
    llama_bin_option,
    present,
    resolve_db,
    resolve_model_path,
    task_option,
    threads_option,
)
from specreg.text import shell_join

if TYPE_CHECKING:
    from specreg.registry.lookup_caches import LookupCache, LookupCacheList


@click.group("lookup-cache")
def lookup_group() -> None:
    """Static n-gram caches from your workload, for --spec-type ngram-cache (read by
    llama-server with --lookup-cache-static; a cache is offered only to models of the tokenizer
    family that built it)."""


@lookup_group.command("build")
@click.argument("name")
@click.argument("files", nargs=-1, type=FILE)
@task_option(multiple=False, required=True, help="The workload the cache is for.")
@click.option(
    "--model", "model_ref", type=MODEL, required=True,
    help="Whose tokenizer tokenizes the text (any model of the family the cache is for).",
)  # fmt: skip
@click.option(
    "--from-runs", is_flag=True,
    help="Add the prompts and outputs of recorded runs of --task on this tokenizer family.",
)  # fmt: skip
@click.option(
    "--run", "run_ids", type=POSITIVE, multiple=True,
    help="Take the prompts and outputs of this run only (repeatable; implies --from-runs).",
)  # fmt: skip
@threads_option
@llama_bin_option
@db_option
@json_option
def build_cmd(name: str, files: tuple[Path, ...], **kw: Any) -> None:
    """Build the lookup cache NAME from FILES and/or recorded runs' prompts and outputs with
    llama.cpp's llama-lookup-create, and record it. Evaluate it on prompts that did not build
    it: a cache holding a prompt's own output measures a replay."""
    from specreg.host.machine import detect_host
    from specreg.llama.install import find_llama
    from specreg.registry.db import opened
    from specreg.runner.lookup_cache import BuildRequest, build_cache

    install, host = find_llama(kw["llama_bin"]), detect_host()
    with opened(resolve_db(kw["db_path"])) as con:
        req = BuildRequest(
            name=name, task=kw["task"], model_path=resolve_model_path(con, kw["model_ref"]),
            files=files, from_runs=kw["from_runs"], run_ids=kw["run_ids"], threads=kw["threads"],
        )  # fmt: skip
        cache = build_cache(con, install, host, req)
    present(cache, kw["as_json"], _print_built)


@lookup_group.command("list")
@click.option("--model", "model_ref", type=MODEL, default=None, help="Only caches it can use.")
@task_option(multiple=False, help="Only caches for this task.")
@db_option
@json_option
def list_cmd(model_ref: str | None, task: str | None, db_path: Path | None, as_json: bool) -> None:
    """The lookup caches in the registry: file, size, tokenizer family, sources, tokens."""
    from specreg.registry.db import opened
    from specreg.registry.lookup_caches import LookupCacheList, list_caches
    from specreg.registry.queries import resolve_model

    with opened(resolve_db(db_path), read_only=True) as con:
        fingerprint = resolve_model(con, model_ref).tok_fingerprint if model_ref else None
        if model_ref and fingerprint is None:
            found = LookupCacheList(())  # a model without a vocabulary fits no cache
        else:
            found = LookupCacheList(tuple(list_caches(con, tok_fingerprint=fingerprint, task=task)))
    present(found, as_json, _print_list)


def _print_built(c: LookupCache) -> None:
    out = console()
    out.print(
        f"lookup cache {c.name}: {c.n_ngrams} n-grams from {c.tokens_str} tokens "
        f"({c.size_str}), tokenizer family {c.tok_family}, task {c.task}"
    )
    out.print(f"  file: {c.path}")
    out.print(f"  sources: {c.sources_str}")
    out.print(f"  built with: {shell_join(c.argv)}")
    out.print(
        f"  use it: specreg run MODEL --spec-type ngram-cache --lookup-cache {shell_join([c.name])}"
    )


def _print_list(found: LookupCacheList) -> None:
    from rich.table import Table

    if not found.caches:
        console().print(
            "no lookup caches: build one with `specreg lookup-cache build NAME --task T --model "
            "M FILES...` (or --from-runs)"
        )
        return
    table = Table("name", "task", "tokenizer family", "tokens", "size", "sources", "file", box=None)
    for c in found.caches:
        table.add_row(
            c.name, c.task or "-", c.tok_family or "-", c.tokens_str, c.size_str, c.sources_str,
            c.path,
        )  # fmt: skip
    console().print(table)


COMMANDS = [lookup_group]
