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


SERVE = ["serve", TARGET, "--dry-run"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["recommend", TARGET, "--temp", "1e9"],
         "Invalid value for '--temp': 1e9 is not a number from 0 to 10"),
        (["recommend", TARGET, "--cores", "100000000"],
         "Invalid value for '--cores': 100000000 is not in the range 1<=x<=4096"),
        (["recommend", TARGET, "--bandwidth", "1e15"],
         "Invalid value for '--bandwidth': 1e15 is not a number from 0.001 to 20000"),
        (["recommend", TARGET, "--memory", "999999T"],
         "Invalid value for '--memory': 999999T is more than 64.0 TB, past any host"),
        (["recommend", TARGET, "--memory", "lots"],
         "Invalid value for '--memory': 'lots' is not a size such as 16G, 512M or 1.5GiB"),
        ([*SERVE, "--ctx", "99999999999"],
         "Invalid value for '--ctx': 99999999999 is not in the range 1<=x<=16777216"),
        ([*SERVE, "--memory-budget", "999999T"],
         "Invalid value for '--memory-budget': 999999T is more than 64.0 TB, past any host"),
        ([*SERVE, "--port", "99999"],
         "Invalid value for '--port': 99999 is not in the range 1<=x<=65535"),
        ([*SERVE, "--parallel", "100000"],
         "Invalid value for '--parallel': 100000 is not in the range 1<=x<=256"),
        ([*SERVE, "--threads", "100000"],
         "Invalid value for '--threads': 100000 is not in the range 1<=x<=4096"),
        ([*SERVE, "--host", "999.1.1.1", "--public"],
         "Invalid value for '--host': '999.1.1.1' is not an IP address or a host name (e.g. "
         "127.0.0.1, 0.0.0.0, ::1)"),
        ([*SERVE, "--ctx", "16777216", "--parallel", "256"],
         "--ctx 16777216 for each of --parallel 256 slots is 4294967296 tokens, more than "
         "llama-server takes (2147483647): give fewer slots or less context"),
        (["run", TARGET, "--ctx", "99999999999"],
         "Invalid value for '--ctx': 99999999999 is not in the range 1<=x<=16777216"),
        (["run", TARGET, "--k", "100000"],
         "Invalid value for '--k': 100000 is not in the range 1<=x<=256"),
        (["run", TARGET, "--seed", "99999999999"],
         "Invalid value for '--seed': 99999999999 is not in the range 0<=x<=4294967295"),
        (["quality", TARGET, "--ctx", "4"],
         "Invalid value for '--ctx': 4 is not in the range 8<=x<=16777216"),
        (["agree", TARGET, "--temp", "1e9"],
         "Invalid value for '--temp': 1e9 is not a number from 0 to 10"),
        (["calibrate", TARGET, "--repetitions", "0"],
         "Invalid value for '--repetitions': 0 is not in the range 1<=x<=1000"),
    ],
    ids=lambda v: " ".join([v[0], *v[2:]]) if isinstance(v, list) else "",
)  # fmt: skip
def test_absurd_values_are_refused_before_anything_starts(
    scanned_db: Path, args: list[str], message: str
) -> None:
    # issue 41 point 13: a numpy warning with a source path, a 47-trillion t/s bound, a context
    # and a budget no host has, all taken; now each is one usage line naming the bound
    r = specreg(*args, "--db", str(scanned_db))
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == f"error: {message} (see `specreg {args[0]} --help`)\n"


def test_a_memory_budget_past_this_hosts_memory_is_refused(scanned_db: Path) -> None:
    r = specreg(*SERVE, "--memory-budget", "60T", "--db", str(scanned_db))
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.startswith("error: --memory-budget 60.0 TB is more than this host's ")
    assert r.stderr.endswith(
        " GB of memory: give less, or leave it out (90% of the memory available at start)\n"
    )


def test_run_passes_own_llama_server_flags_and_refuses_specregs(
    gguf_factory, tmp_path: Path, specreg_home: Path
) -> None:  # type: ignore[no-untyped-def]
    """Issue 41 point 14: `run --server-arg` adds llama-server flags (recorded in the run's
    argv, after specreg's); a flag specreg sets itself is one usage line."""
    from support.fake_server import make_fake

    model = gguf_factory("target.gguf", tokens=["<s>", "</s>", "a", "b"], bos=0, eos=1)
    bin_dir, _ = make_fake(tmp_path, "fine")
    args = ("run", str(model), "--llama-bin", str(bin_dir), "--repeat", "1", "--n-predict", "2")
    r = specreg(*args, "--server-arg", "-c 8192")
    assert (r.returncode, r.stderr) == (
        2,
        "error: --server-arg: specreg sets -c itself, the context per request (--ctx); leave "
        "it out\n",
    )
    r = specreg(*args, "--server-arg=--jinja", "--server-arg", "--cache-type-k q8_0", "--json")
    assert r.returncode == 0, r.stderr
    argv = json.loads(r.stdout)["run"]["argv"]
    assert argv[argv.index("4096") + 1 : argv.index("4096") + 4] == [
        "--jinja", "--cache-type-k", "q8_0"
    ]  # fmt: skip


def test_one_spelling_and_one_unit_across_commands(scanned_db: Path) -> None:
    """Issue 41 point 16: compat printed -md where recommend printed --spec-draft-model, and
    doctor said 23.5 GiB where recommend said 25.3 GB for the same memory."""
    db = ("--db", str(scanned_db))
    compat = specreg("compat", TARGET, "Qwen2.5 Coder 0.5B Instruct", *db)
    flags = next(line for line in compat.stdout.splitlines() if line.startswith("flags: "))
    assert " --spec-draft-model " in flags and " -md " not in flags
    rec = specreg("recommend", TARGET, "--task", "code", *db).stdout
    assert " --spec-draft-model " in rec and " -md " not in rec
    host = next(line for line in rec.splitlines() if line.startswith("host: "))
    memory = host.split(", ")[-1].split(" of memory")[0]  # e.g. "25.3 GB"
    doctor = specreg("doctor", "--no-bandwidth", *db).stdout.splitlines()[0]
    assert f", {memory}, " in doctor and "GiB" not in doctor
