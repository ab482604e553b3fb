"""Small things users hit: task aliases, one-line usage errors for impossible values and blank
models, model ids wherever a model is taken, `compat M M`, read commands that only read."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from support.cli import specreg

TARGET = "Qwen2.5 Coder 32B Instruct"


def test_task_general_is_accepted_and_says_what_it_maps_to(scanned_db: Path) -> None:
    r = specreg("recommend", TARGET, "--task", "general", "--db", str(scanned_db))
    assert r.returncode == 0, r.stderr
    assert r.stderr == "note: task general is chat (its prompts and predictions)\n"
    assert "task=chat" in r.stdout.splitlines()[0]
    doc = json.loads(
        specreg("recommend", TARGET, "--task", "mixed", "--json", "--db", str(scanned_db)).stdout
    )
    assert doc["task"] == "chat"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["recommend", TARGET, "--temp", "-3"],
            "Invalid value for '--temp': -3 is not a number of at least 0 "
            "(see `specreg recommend --help`)",
        ),
        (
            ["recommend", TARGET, "--temp", "nan"],
            "Invalid value for '--temp': nan is not a number of at least 0 "
            "(see `specreg recommend --help`)",
        ),
        (
            ["tune", TARGET, "--budget", "-1"],
            "Invalid value for '--budget': -1 is not in the range x>=1 (see `specreg tune --help`)",
        ),
        (
            ["models", "--max-params", "-5B"],
            "Invalid value for '--max-params': '-5B' is not a parameter count like 500M or 32B "
            "(see `specreg models --help`)",
        ),
        (
            ["run", "x.gguf", "--temp", "-3"],
            "Invalid value for '--temp': -3 is not a number of at least 0 "
            "(see `specreg run --help`)",
        ),
        (
            ["recommend", ""],
            "Invalid value for 'TARGET': empty: give a path, an id from `specreg models`, or a "
            "name (see `specreg recommend --help`)",
        ),
        (
            ["show", "   "],
            "Invalid value for 'MODEL': empty: give a path, an id from `specreg models`, or a "
            "name (see `specreg show --help`)",
        ),
        (
            ["compat", TARGET, ""],
            "Invalid value for 'DRAFT': empty: give a path, an id from `specreg models`, or a "
            "name (see `specreg compat --help`)",
        ),
        (
            ["run", " ", "--draft", "x"],
            "Invalid value for 'TARGET': empty: give a path, an id from `specreg models`, or a "
            "name (see `specreg run --help`)",
        ),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else "",
)
def test_impossible_values_are_one_line_usage_errors(
    scanned_db: Path, args: list[str], message: str
) -> None:
    r = specreg(*args, "--db", str(scanned_db))
    assert r.returncode == 2
    assert r.stderr == f"error: {message}\n"
    assert r.stdout == ""


def test_compat_of_a_model_with_itself_says_it_is_the_same_file(scanned_db: Path) -> None:
    r = specreg("compat", TARGET, TARGET, "--db", str(scanned_db))
    lines = r.stdout.splitlines()
    assert lines[1].startswith("note: TARGET and DRAFT are the same file (")
    assert "a model drafting for itself only adds work" in lines[1]
    doc = json.loads(specreg("compat", TARGET, TARGET, "--json", "--db", str(scanned_db)).stdout)
    assert doc["same_model"] is True
    other = specreg(
        "compat", TARGET, "Qwen2.5 Coder 0.5B Instruct", "--json", "--db", str(scanned_db)
    )
    assert json.loads(other.stdout)["same_model"] is False


def test_read_commands_open_the_registry_read_only(scanned_db: Path, tmp_path: Path) -> None:
    """While another process holds the registry open read-only, a command that opened it for
    writing would fail on DuckDB's lock; the read commands all work."""
    from specreg.declare.templates import INIT_TEMPLATE

    spec = tmp_path / "specreg.yaml"
    spec.write_text(INIT_TEMPLATE)
    holder = duckdb.connect(str(scanned_db), read_only=True)
    try:
        for args in (
            ["models"],
            ["show", TARGET],
            ["compat", TARGET, "Qwen2.5 Coder 0.5B Instruct"],
            ["drafts", TARGET],
            ["runs"],
            ["plan", "--spec", str(spec)],
        ):
            r = specreg(*args, "--db", str(scanned_db))
            assert "error" not in r.stderr, (args, r.stderr)
            assert r.returncode in (0, 1), (args, r.stderr)
        writer = specreg("audit", "--db", str(scanned_db))
        assert writer.returncode == 1
        assert "in use by another specreg process" in writer.stderr
    finally:
        holder.close()


def test_run_takes_a_model_id_like_every_other_command(
    gguf_factory, tmp_path: Path, specreg_home: Path
) -> None:  # type: ignore[no-untyped-def]
    """`run ID` runs the file the id names (a fake llama-server that fails to load records
    the run with the resolved path)."""
    from support.fake_server import make_fake

    model = gguf_factory("target.gguf", tokens=["<s>", "</s>", "a", "b"], bos=0, eos=1)
    assert specreg("scan", str(model.parent)).returncode == 0
    model_id = json.loads(specreg("models", "--json").stdout)["models"][0]["model_id"]
    bin_dir, _ = make_fake(tmp_path, "load")
    r = specreg(
        "run", model_id[:8], "--llama-bin", str(bin_dir), "--repeat", "1", "--n-predict", "4"
    )
    assert r.returncode == 1, r.stderr
    assert "failed and was recorded" in r.stderr
    (run,) = json.loads(specreg("runs", "--json").stdout)["runs"]
    assert run["target_path"] == str(model)
