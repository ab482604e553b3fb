"""The scan commands as a user meets them: exit codes, exact error lines, versioned JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.cli import specreg


def test_scan_json_is_versioned_and_exit_0_when_clean(gguf_factory) -> None:
    path = gguf_factory("a.gguf")
    r = specreg("scan", str(path.parent), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["version"] == "1" and doc["kind"] == "scan"
    assert doc["n_models"] == 1 and doc["new"] == [str(path)]


def test_scan_with_a_bad_file_exits_1_and_names_it(gguf_factory) -> None:
    good = gguf_factory("good.gguf")
    (good.parent / "bad.gguf").write_bytes(b"GGUF" + (7).to_bytes(4, "little") + b"\0" * 40)
    r = specreg("scan", str(good.parent))
    assert r.returncode == 1
    assert f"format: {good.parent / 'bad.gguf'}: unknown GGUF version 7 (supported: 2, 3)" in (
        r.stdout
    )
    assert "1 problem(s); the rest of the scan was recorded:" in r.stdout


def test_scan_of_a_missing_folder_is_a_usage_error(tmp_path: Path) -> None:
    r = specreg("scan", str(tmp_path / "nope"))
    assert r.returncode == 2
    assert r.stderr.strip() == (
        f"error: {tmp_path / 'nope'} does not exist: give a folder or .gguf file to scan"
    )


def test_show_unknown_model_is_a_usage_error_with_a_next_step(gguf_factory) -> None:
    specreg("scan", str(gguf_factory("a.gguf").parent))
    r = specreg("show", "no-such-model")
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "error: no model matches 'no-such-model': give a path, an id from `specreg models`,"
        " or a name"
    )


def test_models_filters_and_show_by_name(tmp_path: Path, sparse_tree: Path) -> None:
    db = tmp_path / "r.duckdb"
    assert specreg("scan", str(sparse_tree), "--db", str(db)).returncode == 0
    r = specreg("models", "--db", str(db), "--max-params", "2B", "--json")
    names = {m["name"] for m in json.loads(r.stdout)["models"]}
    assert "Qwen2.5 Coder 0.5B Instruct" in names
    assert "Qwen2.5 Coder 32B Instruct" not in names
    r = specreg("models", "--db", str(db), "--role", "draft", "--json")
    drafts = {m["name"] for m in json.loads(r.stdout)["models"]}
    assert "EAGLE3 LLaMA3.1 Instruct 8B" in drafts and "Qwen2.5 7B Instruct" not in drafts
    r = specreg("models", "--db", str(db), "--tokenizer", "deepseek-r1-qwen", "--json")
    assert len(json.loads(r.stdout)["models"]) == 2
    r = specreg("models", "--db", str(db), "--arch", "qwen3moe")
    assert "Qwen3 Coder 480B A35B Instruct" in r.stdout and "Gemma" not in r.stdout
    r = specreg("show", "Qwen3 Coder 480B A35B Instruct", "--db", str(db), "--json")
    doc = json.loads(r.stdout)
    assert doc["model"]["expert_used_key"] == "qwen3moe.expert_used_count"
    assert len(doc["files"]) == 8
    assert any(kv["key"] == "qwen3moe.expert_count" and kv["value"] == 160 for kv in doc["kv"])


@pytest.mark.parametrize("value", ["lots", "-5B", "nan", ""])
def test_bad_parameter_count_is_a_one_line_usage_error(gguf_factory, value: str) -> None:
    specreg("scan", str(gguf_factory("a.gguf").parent))
    r = specreg("models", "--max-params", value)
    assert r.returncode == 2
    assert r.stderr == (
        f"error: Invalid value for '--max-params': '{value}' is not a parameter count like 500M"
        " or 32B (see `specreg models --help`)\n"
    )


@pytest.mark.parametrize("name", ["<script>alert(1)</script>", "[bold red]x[/]"])
def test_hostile_names_print_as_text(gguf_factory, name: str) -> None:
    specreg("scan", str(gguf_factory("a.gguf", general_name=name).parent))
    r = specreg("models")
    assert name in r.stdout


STORE_VARIABLES = ("LMSTUDIO_MODELS", "HF_HUB_CACHE", "HF_HOME", "LLAMA_CACHE", "OLLAMA_MODELS",
                   "XDG_CACHE_HOME")  # fmt: skip


def _scan_at_home(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`specreg scan ARGS` for a user whose home is `home`, no store variable set."""
    env = {k: v for k, v in os.environ.items() if k not in STORE_VARIABLES}
    env["HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "specreg", "scan", *args], capture_output=True, text=True, env=env
    )


def test_scan_without_a_path_reads_the_stores_found(gguf_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Issue 41 point 15: `specreg scan` needed paths; a user of LM Studio, Hugging Face or
    Ollama expects their stores found, and Ollama's blobs needed --all-files."""
    home = tmp_path / "home"
    lms = home / ".lmstudio/models/lmstudio-community/A-GGUF"
    hub = home / ".cache/huggingface/hub/models--org--B-GGUF/snapshots/abc"
    blobs = home / ".ollama/models/blobs"
    gguf_factory("a.gguf", directory=lms, general_name="A")
    gguf_factory("b.gguf", directory=hub, general_name="B")
    blob = gguf_factory("c.gguf", directory=blobs, general_name="C")
    blob.rename(blobs / "sha256-0123abcd")  # Ollama's blobs have no .gguf name
    (blobs / "sha256-not-a-model").write_bytes(b"{}")

    r = _scan_at_home(home, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["n_models"] == 3
    assert set(doc["roots"]) == {str(home / ".lmstudio/models"), str(blobs),
                                 str(home / ".cache/huggingface/hub")}  # fmt: skip
    r = _scan_at_home(home)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [
        f"scanning LM Studio ({home / '.lmstudio/models'})",
        f"scanning Hugging Face cache ({home / '.cache/huggingface/hub'})",
        f"scanning Ollama ({blobs}), its blobs by magic",
    ]


def test_scan_without_a_path_and_no_store_says_what_to_do(tmp_path: Path) -> None:
    home = tmp_path / "empty-home"
    home.mkdir()
    r = _scan_at_home(home)
    assert (r.returncode, r.stdout) == (2, "")
    line = r.stderr.strip()
    assert "\n" not in line
    assert line.startswith(
        f"error: no PATH given and no model store here (LM Studio: {home / '.lmstudio/models'}, "
    )
    assert f"Ollama: {home / '.ollama/models/blobs'}" in line
    assert line.endswith(": give the folders or .gguf files to scan, e.g. `specreg scan ~/models`")
