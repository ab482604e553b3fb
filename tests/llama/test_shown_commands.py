"""Commands shown to users carry no measurement-only flags (issue 25): a recommended command
for fewer MoE experts had `-lv 4`, the log verbosity a measurement reads the override from."""

from __future__ import annotations

from pathlib import Path

from specreg.host.machine import Host
from specreg.llama.config import Config, server_command
from specreg.llama.install import DIALECT_SPEC_TYPE

from support.cli import specreg, specreg_json

TARGET = "Qwen3 Coder 30B A3B Instruct"


def test_recommended_commands_have_no_log_verbosity(sparse_tree: Path, tmp_path: Path) -> None:
    db = str(tmp_path / "registry.duckdb")
    assert specreg("scan", str(sparse_tree), "--db", db).returncode == 0
    rec = specreg_json(
        "recommend", TARGET, "--policy", "speed", "--top", "20", "--db", db, "--json"
    )
    fewer = [o for o in rec["options"] if o["experts"] is not None and o.get("command")]
    assert fewer, [o["command"] for o in rec["options"]]
    for o in fewer:
        assert "--override-kv" in o["command"] and "-lv" not in o["command"].split(), o["command"]


def test_a_measurement_still_logs_what_it_reads(tmp_path: Path) -> None:
    host = Host("h", "AMD EPYC 9655", 8, 16, 2**40, 1, None, "Linux")
    config = Config(spec_type="none", experts=4, expert_key="qwen3moe.expert_used_count")
    target = tmp_path / "t.gguf"
    measured = server_command(config, target, None, DIALECT_SPEC_TYPE, host)
    shown = server_command(config, target, None, DIALECT_SPEC_TYPE, host, measuring=False)
    assert measured[measured.index("-lv") + 1] == "4"
    assert "-lv" not in shown and shown == [a for a in measured if a not in ("-lv", "4")]
