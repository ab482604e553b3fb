"""Untrusted text never drives the terminal: names, token texts, templates, tokenizer names,
file names and llama.cpp messages holding CSI, OSC (title, OSC 52 clipboard), BEL, C1 and bidi
controls print visibly escaped through every command that shows them, on stdout and stderr;
`--json` carries them exactly; a 10 MB name is cut for reading; every printed command line
survives a hostile file name when pasted into a shell."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pytest

from support.cli import specreg

# Clear screen, set the window title, write the clipboard (OSC 52), ring, a one-byte CSI (C1)
# and a right-to-left override.
HOSTILE = "evil\x1b[2J\x1b]0;pwned\x07\x1b]52;c;cm0gLXJmIH4=\x07\x9b31m\u202eman"
SHOWN = r"evil\x1b[2J\x1b]0;pwned\x07\x1b]52;c;cm0gLXJmIH4=\x07\x9b31m\u202eman"
# What must never reach a terminal raw (newline and tab are layout).
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
BIG = 10_000_000


def assert_safe(r: subprocess.CompletedProcess[str]) -> None:
    for stream, text in (("stdout", r.stdout), ("stderr", r.stderr)):
        raw = RAW_CONTROL.search(text)
        assert raw is None, f"raw {raw.group()!r} on {stream}: {text[:2000]}"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A registry of hostile GGUFs: names, a chat template, a tokenizer name, a token text and
    file names with control characters; a file name that is a shell command; a 10 MB name."""
    import numpy as np
    from gguf import GGUFWriter

    from specreg.registry.db import opened
    from specreg.registry.scan import scan_paths
    from specreg.samples.demo import add_kv

    root = tmp_path_factory.mktemp("hostile")
    models = root / "models"
    models.mkdir()
    tokens = [f"t{i}" for i in range(64)]

    def make(name: str, general_name: str, toks: list[str], pre: str = "qwen2", **kv: str) -> Path:
        path = models / name
        w = GGUFWriter(path, "llama")
        w.add_name(general_name)
        w.add_block_count(1)
        w.add_context_length(128)
        w.add_embedding_length(4)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(toks)
        w.add_token_types([1] * len(toks))
        w.add_token_merges(["t 1"])
        for key, value in kv.items():
            add_kv(w, key.replace("__", "."), value)
        w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path

    odd_tokens = list(tokens)
    odd_tokens[10] = HOSTILE
    paths = {
        "target": make(
            f"target{HOSTILE}.gguf", "T" + HOSTILE, tokens, tokenizer__chat_template=HOSTILE
        ),
        "draft": make("x $(touch pwned).gguf", "D" + HOSTILE, tokens),
        "odd": make("odd.gguf", "O" + HOSTILE, odd_tokens, pre=HOSTILE),
        "big": make("big.gguf", "B" * BIG, tokens),
    }
    db = root / "registry.duckdb"
    with opened(db) as con:
        assert scan_paths(con, [models]).ok
    return {**paths, "db": db, "root": root}


def ids(hostile: dict[str, Path]) -> dict[str, str]:
    r = specreg("models", "--json", "--db", str(hostile["db"]))
    by_path = {m["path"]: m["model_id"] for m in json.loads(r.stdout)["models"]}
    return {k: by_path[str(hostile[k])] for k in ("target", "draft", "odd", "big")}


def test_scan_prints_file_names_escaped(hostile: dict[str, Path], tmp_path: Path) -> None:
    r = specreg("scan", str(hostile["target"].parent), "-v", "--db", str(tmp_path / "r.duckdb"))
    assert r.returncode == 0, r.stderr
    assert_safe(r)
    assert f"new: {hostile['target'].parent}/target{SHOWN}.gguf" in r.stdout


@pytest.mark.parametrize(
    "command",
    [
        ["models"],
        ["models", "--tokenizer", HOSTILE],
        ["show", "target"],
        ["show", "target", "--full"],
        ["show", "odd"],
        ["compat", "target", "draft"],
        ["compat", "target", "odd"],
        ["compat", "odd", "odd"],
        ["drafts", "target", "--rejected"],
        ["drafts", "odd", "--rejected"],
        ["audit"],
        ["recommend", "target"],
    ],
    ids=" ".join,
)
def test_every_command_prints_model_text_escaped(
    hostile: dict[str, Path], tmp_path: Path, command: list[str]
) -> None:
    known = ids(hostile)
    args = [known.get(a, a) for a in command]
    db = tmp_path / "registry.duckdb"
    db.write_bytes(hostile["db"].read_bytes())
    r = specreg(*args, "--db", str(db))
    assert r.returncode in (0, 1), r.stderr
    assert_safe(r)
    assert "\\x1b" in r.stdout  # the model text was shown, escaped (audit names pairs too)


def test_errors_on_stderr_are_escaped(hostile: dict[str, Path]) -> None:
    r = specreg("show", HOSTILE, "--db", str(hostile["db"]))
    assert r.returncode == 2
    assert_safe(r)
    known = ids(hostile)
    nearest = ", ".join(  # the names closest to the one given (issue 41), escaped as well
        f"{c}{SHOWN} ({known[k][:10]})" for c, k in (("T", "target"), ("O", "odd"), ("D", "draft"))
    )
    assert r.stderr == (
        f"error: no model matches '{SHOWN}': give a path, an id from `specreg models`, or a name"
        f" (nearest: {nearest})\n"
    )


@pytest.mark.parametrize(
    ("command", "find"),
    [
        (["models", "--json"], lambda doc: [m["name"] for m in doc["models"]]),
        (["show", "target", "--json"], lambda doc: [doc["model"]["name"]]),
        (["compat", "target", "draft", "--json"], lambda doc: [doc["target"]["name"]]),
        # Every hostile model is as large as the others, so they are listed apart as not drafts.
        (
            ["drafts", "draft", "--json"],
            lambda doc: [d["draft"]["name"] for d in doc["drafts"] + doc["not_drafts"]],
        ),
        (["graph", "export"], lambda doc: [n.get("name") for n in doc["nodes"]]),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else "",
)
def test_json_is_exact_and_terminal_safe(hostile: dict[str, Path], tmp_path: Path, command, find):  # type: ignore[no-untyped-def]
    known = ids(hostile)
    db = tmp_path / "registry.duckdb"
    db.write_bytes(hostile["db"].read_bytes())
    r = specreg(*[known.get(a, a) for a in command], "--db", str(db))
    assert r.returncode in (0, 1), r.stderr
    assert_safe(r)  # C1 and bidi controls are \\u escapes in the document
    names = find(json.loads(r.stdout))
    assert "T" + HOSTILE in names or "D" + HOSTILE in names


def test_graphml_is_valid_xml_and_terminal_safe(hostile: dict[str, Path], tmp_path: Path) -> None:
    import xml.etree.ElementTree as ET

    db = tmp_path / "registry.duckdb"
    db.write_bytes(hostile["db"].read_bytes())
    r = specreg("graph", "export", "--format", "graphml", "--db", str(db))
    assert r.returncode == 0, r.stderr
    assert_safe(r)
    ET.fromstring(r.stdout)  # C0 controls cannot be XML: they are visible escapes


def test_a_10_mb_name_is_cut_for_reading(hostile: dict[str, Path]) -> None:
    big = ids(hostile)["big"]
    db = str(hostile["db"])
    shown = specreg("show", big, "--db", db)
    assert shown.returncode == 0, shown.stderr
    assert len(shown.stdout) < 50_000
    assert f"({BIG - 120:,} more characters)" in shown.stdout
    assert "--full shows them whole" in shown.stdout
    listed = specreg("models", "--db", db)
    assert len(listed.stdout) < 20_000
    full = specreg("show", big, "--full", "--db", db)
    assert "B" * BIG in full.stdout
    exact = json.loads(specreg("show", big, "--json", "--db", db).stdout)
    assert exact["model"]["name"] == "B" * BIG


def test_runs_show_llama_messages_and_paths_escaped(
    hostile: dict[str, Path], tmp_path: Path
) -> None:
    from specreg.registry.db import opened
    from specreg.registry.run_store import RunRecord, record_run

    db = tmp_path / "registry.duckdb"
    db.write_bytes(hostile["db"].read_bytes())
    run = RunRecord(
        kind="run",
        status="failed",
        started_at=datetime.now(timezone.utc),
        config={"engine": "server"},
        config_label="draft-simple " + HOSTILE,
        spec_type="draft-simple",
        error_kind="load",
        error="llama-server failed: " + HOSTILE,
        llama_message="error loading model " + HOSTILE,
        target_path=str(hostile["target"]),
        log_path=str(tmp_path / f"log{HOSTILE}.txt"),
    )
    with opened(db) as con:
        run_id = record_run(con, run)
    for args in (["runs"], ["runs", str(run_id)], ["runs", "--failed"]):
        r = specreg(*args, "--db", str(db))
        assert r.returncode == 0, r.stderr
        assert_safe(r)
        assert "\\x1b" in r.stdout
    doc = json.loads(specreg("runs", str(run_id), "--json", "--db", str(db)).stdout)
    assert doc["runs"][0]["llama_message"] == "error loading model " + HOSTILE


def test_compat_flags_line_survives_bash(hostile: dict[str, Path], tmp_path: Path) -> None:
    """The flags line, pasted into bash after a harmless command, passes the draft's path as
    one argument and runs nothing of what the file name spells."""
    known = ids(hostile)
    r = specreg("compat", known["target"], known["draft"], "--db", str(hostile["db"]))
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("flags: ")]
    flags = line[len("flags: ") :]
    assert "'" + str(hostile["draft"]) + "'" in flags
    subprocess.run(["bash", "-n"], input=flags, text=True, check=True)
    out = subprocess.run(
        ["bash", "-c", "printf '%s\\n' " + flags], cwd=tmp_path, capture_output=True, check=True
    )
    assert str(hostile["draft"]).encode() in out.stdout.splitlines()
    assert not (tmp_path / "pwned").exists()


def test_recommend_command_line_survives_bash(hostile: dict[str, Path], tmp_path: Path) -> None:
    """The printed llama-server line names the hostile target file exactly when run."""
    known = ids(hostile)
    env = {"SPECREG_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    env.pop("SPECREG_LLAMA_BIN", None)
    r = specreg("recommend", known["target"], "--db", str(hostile["db"]), env=env)
    assert r.returncode == 0, r.stderr
    assert_safe(r)
    (line,) = [x.strip() for x in r.stdout.splitlines() if x.strip().startswith("llama-server ")]
    stub = "llama-server() { printf '%s\\n' \"$@\"; }; "
    out = subprocess.run(["bash", "-c", stub + line], cwd=tmp_path, capture_output=True)
    assert out.returncode == 0, out.stderr
    assert os.fsencode(hostile["target"]) in out.stdout.splitlines()


def test_export_script_names_the_hostile_files_exactly(
    hostile: dict[str, Path], tmp_path: Path
) -> None:
    known = ids(hostile)
    spec = tmp_path / "specreg.yaml"
    spec.write_text(
        "version: 1\nllama:\n  dialect: current\nmodels:\n"
        f"  {known['target']}:\n    aliases: [t]\n  {known['draft']}:\n    aliases: [d]\n"
        "roles:\n  r:\n    target: t\n    configs:\n      default:\n        draft: d\n"
    )
    r = specreg(
        "export", "--format", "llama-server", "--spec", str(spec), "--db", str(hostile["db"])
    )
    assert r.returncode == 0, r.stderr
    assert_safe(r)
    script = r.stdout
    subprocess.run(["sh", "-n"], input=script, text=True, check=True)
    fake = tmp_path / "bin" / "llama-server"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf \'%s\\n\' "$a"; done\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    out = subprocess.run(
        ["sh", "-c", script + "\nrun_r"], cwd=tmp_path, env=env, capture_output=True, check=True
    )
    argv = out.stdout.split(b"\n")
    assert os.fsencode(hostile["target"]) in argv
    assert os.fsencode(hostile["draft"]) in argv
    assert not (tmp_path / "pwned").exists()


def test_export_llama_swap_escapes_in_yaml(hostile: dict[str, Path], tmp_path: Path) -> None:
    import yaml

    known = ids(hostile)
    spec = tmp_path / "specreg.yaml"
    spec.write_text(
        "version: 1\nllama:\n  dialect: current\nmodels:\n"
        f"  {known['target']}:\n    aliases: [t]\nroles:\n  r:\n    target: t\n"
    )
    r = specreg("export", "--format", "llama-swap", "--spec", str(spec), "--db", str(hostile["db"]))
    assert r.returncode == 0, r.stderr
    assert_safe(r)
    cmd = yaml.safe_load(r.stdout)["models"]["r"]["cmd"]
    assert "-m " + shlex.quote(str(hostile["target"])) in cmd.splitlines()


def test_plan_shows_undeclared_hostile_models_escaped(
    hostile: dict[str, Path], tmp_path: Path
) -> None:
    spec = tmp_path / "specreg.yaml"
    spec.write_text(f"version: 1\nroots: [{json.dumps(str(hostile['target'].parent))}]\n")
    r = specreg("plan", "--spec", str(spec), "--db", str(hostile["db"]))
    assert r.returncode == 1, r.stderr
    assert_safe(r)
    assert f"T{SHOWN}"[:40] in r.stdout
