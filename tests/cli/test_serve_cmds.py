"""`specreg serve` as a user plans it (--dry-run): its own llama-server flags and the context
each backend gets (issue 41 point 14)."""

from __future__ import annotations

import json
from pathlib import Path

from support.cli import specreg

TARGET = "Qwen2.5 Coder 0.5B Instruct"  # trained on 32768 tokens, 0.5 GB of weights
ROOMY = '{"mem_bytes": 1000000000000}'


def _routes(db: Path, *args: str, facts: str = ROOMY) -> dict:  # type: ignore[type-arg]
    r = specreg("serve", TARGET, "--dry-run", "--policy", "fixed", "--json", "--db", str(db),
                *args, env={"SPECREG_HOST_FACTS": facts})  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_server_args_reach_every_backend_with_their_origin(scanned_db: Path) -> None:
    doc = _routes(scanned_db, "--server-arg=--jinja", "--server-arg", "--cache-type-k q8_0")
    assert doc["backends"]
    for b in doc["backends"]:
        argv = b["argv"]
        at = argv.index("--jinja")
        assert argv[at : at + 3] == ["--jinja", "--cache-type-k", "q8_0"]
        assert at > argv.index("-c")  # after specreg's own flags
        assert b["server_args"] == [
            {"args": ["--jinja", "--cache-type-k", "q8_0"], "origin": "serve --server-arg"}
        ]
    text = specreg("serve", TARGET, "--dry-run", "--policy", "fixed", "--db", str(scanned_db),
                   "--server-arg=--jinja", env={"SPECREG_HOST_FACTS": ROOMY})  # fmt: skip
    assert "  --jinja: serve --server-arg" in text.stdout


def test_a_flag_serve_sets_itself_is_refused_before_anything_starts(scanned_db: Path) -> None:
    for given, flag in (("-c 8192", "-c"), ("--port=9", "--port"), ("-np 2", "-np")):
        r = specreg("serve", TARGET, "--dry-run", "--server-arg", given, "--db", str(scanned_db))
        assert (r.returncode, r.stdout) == (2, ""), given
        assert r.stderr.startswith(f"error: serve --server-arg: specreg sets {flag} itself, ")


def test_the_context_follows_the_model_and_the_memory(scanned_db: Path) -> None:
    """Every backend got -c 4096 a slot whatever the model's trained context and the memory."""
    roomy = _routes(scanned_db)
    for b in roomy["backends"]:
        assert b["ctx"] == {
            "tokens": 32768,
            "why": "the model's trained context (32768), which memory holds",
        }
        assert b["argv"][b["argv"].index("-c") + 1] == str(32768 * b["slots"])
    # 2 GB: half the 1.5 GB beside the weights holds less than the trained context for 8 slots
    tight = _routes(scanned_db, facts='{"mem_bytes": 2000000000}')
    for b in tight["backends"]:
        assert 4096 <= b["ctx"]["tokens"] < 32768
        assert b["ctx"]["why"].startswith("as much of the trained 32768 as half the memory")
    given = _routes(scanned_db, "--ctx", "2048")
    assert {(b["ctx"]["tokens"], b["ctx"]["why"]) for b in given["backends"]} == {
        (2048, "serve --ctx")
    }
