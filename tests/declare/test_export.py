"""`specreg export`: launch configurations that the target tools read by their own rules, with
the flags of the user's llama.cpp dialect and the origin of every flag."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import jsonschema
import pytest
import yaml

from specreg.cli.main import error_line
from specreg.declare.export import ExportError, render_models_preset, swap_cmd
from specreg.declare.launch import Flag, Launch, LaunchPlan, build
from specreg.declare.spec import load_spec, read_yaml, write_yaml
from specreg.host.sources import llama_source_dir
from specreg.registry.db import opened

from support.declare import (
    GEMMA_27B,
    IMPORTED_ROLES,
    QWEN3_30B,
    QWEN3_DRAFT,
    QWEN25_05B,
    Site,
    run_cli,
)

# A stand-in llama-server at the process boundary: answers --help in one dialect, and records
# the argv it was started with.
FAKE_SERVER = """#!/bin/sh
case "$1" in
  --help) cat <<'EOF'
{help}
EOF
  exit 0;;
  --version) echo "version: 11434 (fake)"; exit 0;;
esac
for a in "$@"; do printf '%s\\n' "$a"; done > "$SPECREG_TEST_ARGV"
"""
HELP = {
    "current": "--spec-type [none|draft-simple|draft-mtp|ngram-simple|ngram-mod|ngram-cache]\n"
    "--spec-draft-n-max N   number of tokens to draft",
    "legacy": "-md,    --model-draft FNAME   draft model\n"
    "--draft-max, --draft, --draft-n N   number of tokens to draft (default: 16)",
}


def fake_llama(tmp_path: Path, dialect: str) -> Path:
    bin_dir = tmp_path / f"llama-{dialect}" / "bin"
    bin_dir.mkdir(parents=True)
    server = bin_dir / "llama-server"
    server.write_text(FAKE_SERVER.replace("{help}", HELP[dialect]))
    server.chmod(0o755)
    return bin_dir


def use_llama(s: Site, bin_dir: Path) -> None:
    doc = read_yaml(s.spec)
    doc["llama"]["bin_dir"] = str(bin_dir)
    write_yaml(s.spec, doc)


def launches(s: Site, **kw: object) -> LaunchPlan:
    spec, _ = load_spec(s.spec)
    with opened(s.db) as con:
        return build(con, spec, **kw)  # type: ignore[arg-type]


def export(s: Site, fmt: str, *extra: str) -> str:
    code, out, err = run_cli(
        ["export", "--format", fmt, "--spec", str(s.spec), "--db", str(s.db), *extra]
    )
    assert code == 0, err
    return out


def run_function(script: str, name: str, tmp_path: Path) -> list[str]:
    """Source the exported script in sh and run one launch function; return the argv the
    (fake) llama-server received."""
    path = tmp_path / "launch.sh"
    path.write_text(script)
    argv_file = tmp_path / "argv.txt"
    harness = f'numactl() {{ shift; "$@"; }}; . {shlex.quote(str(path))}; {name}'
    env = {**os.environ, "SPECREG_TEST_ARGV": str(argv_file)}
    subprocess.run(["sh", "-c", harness], check=True, env=env)
    return argv_file.read_text().splitlines()


# A host whose memory holds every model's trained context (the launches' -c follows the memory).
ROOMY = '{"mem_bytes": 1000000000000}'


def test_llama_server_script_runs_exactly_the_argv_shown(
    site: Site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECREG_HOST_FACTS", ROOMY)
    use_llama(site, fake_llama(tmp_path, "current"))
    script = export(site, "llama-server")
    subprocess.run(["sh", "-n"], input=script, text=True, check=True)
    assert "# llama.cpp dialect: current (detected from " in script
    plan = launches(site, port="8080")
    assert {x.name for x in plan.launches} == set(IMPORTED_ROLES)
    for launch in plan.launches:
        got = run_function(script, f"run_{launch.name}", tmp_path)
        assert launch.argv[:3] == [
            "numactl",
            "--interleave=all",
            str(Path(str(tmp_path / "llama-current" / "bin" / "llama-server"))),
        ]
        assert got == launch.argv[3:], launch.name

    front = next(x for x in plan.launches if x.role == "frontdoor")
    assert front.argv[3:] == [
        "-m",
        str(site.models / QWEN3_30B),
        "-t",
        "96",
        "-c",
        "262144",  # Qwen3-Coder-30B-A3B's trained context, which the memory holds
        "--spec-type",
        "ngram-cache,draft-simple",  # the order llama.cpp tries them
        "--spec-draft-model",
        str(site.models / QWEN3_DRAFT),
        "--spec-draft-n-max",
        "16",
        "--override-kv",
        "qwen3moe.expert_used_count=int:6",
        "--port",
        "8080",
    ]
    gemma = next(x for x in plan.launches if x.role == "worker_gemma")
    assert gemma.argv[3:] == [
        "-m",
        str(site.models / GEMMA_27B),
        "-t",
        "96",
        "-c",
        "131072",
        "--spec-type",
        "ngram-cache",
        "--port",
        "8080",
    ]


def test_legacy_dialect_uses_draft_max_and_skips_what_it_cannot_run(
    site: Site, tmp_path: Path
) -> None:
    use_llama(site, fake_llama(tmp_path, "legacy"))
    plan = launches(site, port="8080")
    assert plan.dialect == "legacy"
    coder = next(x for x in plan.launches if x.role == "coder_escalation")
    args = coder.argv[3:]
    assert "--spec-type" not in args and "--spec-draft-n-max" not in args
    assert args[args.index("-md") + 1] == str(site.models / QWEN25_05B)
    assert args[args.index("--draft-max") + 1] == "16"
    skipped = {s.role: s.reason for s in plan.skipped}
    assert skipped["frontdoor"].startswith(
        "ngram-cache, draft-simple: this llama.cpp's server predates --spec-type"
    )
    assert skipped["worker_gemma"].startswith(
        "ngram-cache is not available in this llama.cpp's server"
    )
    script = export(site, "llama-server")
    assert run_function(script, "run_coder_escalation", tmp_path) == args
    assert "# skipped frontdoor/default: ngram-cache, draft-simple" in script
    # the models preset needs router mode, which legacy servers do not have
    code, _, err = run_cli(
        ["export", "--format", "models-preset", "--spec", str(site.spec), "--db", str(site.db)]
    )
    assert code == 2
    assert err.startswith("error: models-preset needs a llama-server with --models-preset")


def test_every_flag_says_where_it_came_from(
    site: Site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECREG_HOST_FACTS", ROOMY)
    use_llama(site, fake_llama(tmp_path, "current"))
    lines = site.spec.read_text().splitlines()
    plan = launches(site, port="8080")
    checked = 0
    for launch in plan.launches:
        for flag in (*launch.prefix, *launch.flags):
            assert flag.origin, (launch.name, flag)
            for key, line in re.findall(r"([\w.]+) \(specreg\.yaml:(\d+)\)", flag.origin):
                leaf = key.rsplit(".", 1)[-1]
                assert lines[int(line) - 1].lstrip().startswith(f"{leaf}:"), (flag, key)
                checked += 1
    assert checked > 30
    coder = next(x for x in plan.launches if x.role == "coder_escalation")
    origins = {f.flag: f.origin for f in coder.flags}
    assert re.fullmatch(
        r"roles\.coder_escalation\.configs\.default\.draft_max "
        r"\(specreg\.yaml:\d+\)",
        origins["--spec-draft-n-max"],
    )
    assert origins["--spec-type"].startswith(
        "implied by roles.coder_escalation.configs.default.draft (specreg.yaml:"
    )
    assert origins["-c"] == "not declared: the model's trained context (32768), which memory holds"
    assert origins["-m"].endswith(
        f"-> registry path of Qwen2.5-Coder-32B-Instruct ({origins['-m'].rsplit('(', 1)[1]}"
    )

    out = export(site, "llama-server", "--json")
    doc = json.loads(out)
    assert doc["kind"] == "export" and doc["dialect"] == "current"
    jc = next(x for x in doc["launches"] if x["role"] == "coder_escalation")
    assert jc["argv"] == coder.argv
    assert all(f["origin"] for f in jc["flags"])


# The part of llama-swap's config-schema.json (mostlygeek/llama-swap) that the export uses.
LLAMA_SWAP_SCHEMA = {
    "type": "object",
    "required": ["models"],
    "properties": {
        "models": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "required": ["cmd"],
                "properties": {
                    "cmd": {"type": "string", "minLength": 1},
                    "name": {"type": "string", "maxLength": 128},
                    "description": {"type": "string", "maxLength": 1024},
                },
            },
        }
    },
}


def llama_swap_argv(cmd: str) -> list[str]:
    """How llama-swap turns `cmd` into argv: comment lines dropped, lines joined, shell-split."""
    kept = []
    for line in cmd.split("\n"):
        t = line.strip()
        if t.startswith("#"):
            continue
        kept.append(t[:-1] + " " if t.endswith("\\") else line)
    return shlex.split("\n".join(kept))


def test_llama_swap_config_parses_and_runs_the_same_argv(site: Site, tmp_path: Path) -> None:
    use_llama(site, fake_llama(tmp_path, "current"))
    text = export(site, "llama-swap")
    doc = yaml.safe_load(text)  # another YAML parser than the one that wrote it
    jsonschema.validate(doc, LLAMA_SWAP_SCHEMA)
    plan = launches(site, port="${PORT}")
    assert set(doc["models"]) == {x.name for x in plan.launches}
    for launch in plan.launches:
        cmd = doc["models"][launch.name]["cmd"]
        argv = llama_swap_argv(cmd)
        assert argv == launch.argv
        assert argv[argv.index("--port") + 1] == "${PORT}"
        # each flag line is preceded by a comment naming its origin
        lines = cmd.splitlines()
        for f in launch.flags:
            i = next(
                n
                for n, line in enumerate(lines)
                if not line.startswith("#") and shlex.split(line) == f.args
            )
            assert lines[i - 1] == f"# {f.origin}"
    assert swap_cmd(plan.launches[0]).endswith("\n")


def parse_preset_ini(text: str) -> dict[str, dict[str, str]]:
    """llama.cpp's preset grammar (common/preset.cpp, parse_ini_from_file), line by line."""
    sections: dict[str, dict[str, str]] = {}
    current = "default"
    for line in re.split(r"\r\n|\n|\r", text):
        if re.fullmatch(r"[ \t]*", line) or re.fullmatch(r"[ \t]*[;#].*", line):
            continue
        m = re.fullmatch(r"\[[ \t]*([^\]]*)[ \t]*\][ \t]*(?:[;#].*)?", line)
        if m:
            current = m.group(1)
            sections[current] = {}
            continue
        m = re.fullmatch(
            r"([a-zA-Z_][a-zA-Z0-9_.-]*)[ \t]*=[ \t]*([^;#\r\n]*?)[ \t]*(?:[;#].*)?", line
        )
        if not m:
            raise ValueError(f"llama.cpp would fail to parse this preset line: {line!r}")
        sections.setdefault(current, {})[m.group(1)] = m.group(2)
    return sections


def server_preset_keys() -> tuple[set[str], set[str]]:
    """(accepted, removed): the keys llama-server accepts in a preset (its argument names without
    dashes and their environment names in common/arg.cpp, for the server example, plus the
    preset-only options), and those among them whose handler reports a removed argument."""
    src = (llama_source_dir() / "common" / "arg.cpp").read_text()
    accepted, removed = {"version"}, set()
    for chunk in src.split("common_arg(")[1:]:
        body = chunk.split("add_opt(")[0]
        names = re.match(r"\s*\{([^}]*)\}", body)
        if not names:
            continue
        examples = re.search(r"set_examples\(\{([^}]*)\}\)", body)
        if examples and not re.search(r"LLAMA_EXAMPLE_(SERVER|COMMON)\b", examples.group(1)):
            continue
        keys = {n.lstrip("-") for n in re.findall(r'"([^"]+)"', names.group(1))}
        keys |= set(re.findall(r'set_env\("([A-Z0-9_]+)"\)', body))
        accepted |= keys
        if "arg_removed(" in body:
            removed |= keys
    return accepted, removed


def test_models_preset_parses_with_llama_cpp_rules(site: Site, tmp_path: Path) -> None:
    use_llama(site, fake_llama(tmp_path, "current"))
    text = export(site, "models-preset")
    sections = parse_preset_ini(text)
    plan = launches(site, port=None)
    assert sections["default"] == {"version": "1"}
    assert set(sections) - {"default"} == {x.name for x in plan.launches}
    accepted, removed = server_preset_keys()
    assert {"spec-draft-n-max", "spec-type", "spec-draft-model", "override-kv"} <= accepted
    assert "draft-max" in removed  # the legacy spelling is a hard error in the pinned build
    for launch in plan.launches:
        got = sections[launch.name]
        assert set(got) <= accepted, set(got) - accepted
        assert not set(got) & removed, set(got) & removed
        assert "port" not in got  # the router assigns ports
        want = {f.preset_key: f.value for f in launch.flags}
        assert got == want
    front = sections["frontdoor"]
    assert front["spec-draft-n-max"] == "16" and front["spec-type"] == "ngram-cache,draft-simple"
    assert front["override-kv"] == "qwen3moe.expert_used_count=int:6"
    # the origin of each key is the comment line above it
    lines = text.splitlines()
    i = lines.index("spec-draft-n-max = 16")
    assert lines[i - 1].startswith("; roles.frontdoor.configs.default.draft_max (specreg.yaml:")


def test_models_preset_refuses_values_llama_cpp_would_cut(tmp_path: Path) -> None:
    bad = Launch(
        "coder",
        "default",
        "llama-server",
        (),
        (Flag("-m", "/models/v1#final/model.gguf", "test", "model"),),
        "current",
    )
    with pytest.raises(ExportError) as info:
        render_models_preset(LaunchPlan("current", "test", (bad,), ()))
    assert error_line(info.value) == (  # as the CLI says it; the core says `format`
        "coder: model = '/models/v1#final/model.gguf' cannot be written in a preset: llama.cpp's "
        "preset parser ends a value at ';' or '#' (rename the file or use --format llama-server)"
    )
    assert info.value.exit_code == 2


@pytest.mark.llama
def test_real_llama_server_reads_the_preset(site: Site, tmp_path: Path, llama_bin: Path) -> None:
    """The pinned llama-server, in router mode, loads the exported preset and lists its models
    (an unknown key or a bad line would make it exit)."""
    use_llama(site, llama_bin)
    plan = launches(site, port=None)
    assert (plan.dialect, plan.dialect_origin) == (
        "current",
        f"detected from {llama_bin}/llama-server --help",
    )
    preset = tmp_path / "models.ini"
    export(site, "models-preset", "-o", str(preset))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = tmp_path / "server.log"
    env = {**os.environ, "LLAMA_CACHE": str(tmp_path / "llama-cache")}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                str(llama_bin / "llama-server"),
                "--models-preset",
                str(preset),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--no-models-autoload",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        data = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/models", timeout=2) as r:
                    data = json.load(r)
                    break
            except OSError:
                time.sleep(0.3)
        assert data is not None, log.read_text()[-2000:]
        ids = {m["id"] for m in data["data"]}
        assert {x.name for x in launches(site, port=None).launches} <= ids
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_role_filter(site: Site) -> None:
    out = export(site, "llama-server", "--role", "general")
    assert "run_general()" in out and "run_frontdoor" not in out
    code, _, err = run_cli(
        [
            "export",
            "--format",
            "llama-swap",
            "--role",
            "nope",
            "--spec",
            str(site.spec),
            "--db",
            str(site.db),
        ]
    )
    assert code == 2
    assert err == (f"error: no role 'nope' in {site.spec} (declared: {', '.join(IMPORTED_ROLES)})")


def test_a_candidate_set_exports_each_member_under_its_own_name(site: Site, tmp_path: Path) -> None:
    use_llama(site, fake_llama(tmp_path, "current"))
    doc = read_yaml(site.spec)
    role = next(iter(doc["roles"]))
    doc["roles"][role]["configs"] = {
        "code": [{"spec_type": "none"}, {"spec_type": "ngram-mod", "draft_max": 8}]
    }
    write_yaml(site.spec, doc)
    plan = launches(site, roles=(role,))
    assert [(x.name, x.task, x.member) for x in plan.launches] == [
        (f"{role}-code-0", "code", 0),
        (f"{role}-code-1", "code", 1),
    ]
    ngram = dict(f.args for f in plan.launches[1].flags if len(f.args) == 2)
    assert (ngram["--spec-type"], ngram["--spec-ngram-mod-n-max"]) == ("ngram-mod", "8")
    assert plan.launches[1].flags[0].origin  # every flag still says where it came from
    out = json.loads(export(site, "llama-server", "--role", role, "--json"))
    assert [(x["task"], x["member"]) for x in out["launches"]] == [("code", 0), ("code", 1)]
    script = export(site, "llama-server", "--role", role)
    assert f"run_{role}_code_0()" in script and f"run_{role}_code_1()" in script


def test_own_llama_server_flags_are_passed_with_their_origin(
    site: Site, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 41 point 14: specreg.yaml's llama_server_args for a model (wherever it is the
    target) and for a role reach the exported argv after specreg's flags, each with its key."""
    monkeypatch.setenv("SPECREG_HOST_FACTS", ROOMY)
    use_llama(site, fake_llama(tmp_path, "current"))
    doc = read_yaml(site.spec)
    role = doc["roles"]["coder_escalation"]
    target = next(m for m in doc["models"].values() if role["target"] in m.get("aliases", []))
    target["llama_server_args"] = ["--jinja", "--cache-type-k q8_0"]
    role["llama_server_args"] = "--mlock"
    write_yaml(site.spec, doc)
    coder = next(x for x in launches(site, port="8080").launches if x.role == "coder_escalation")
    argv = coder.argv[3:]
    assert argv[-6:] == ["--jinja", "--cache-type-k", "q8_0", "--mlock", "--port", "8080"]
    origins = {f.flag: f.origin for f in coder.flags}
    assert re.fullmatch(r"models\.\w+\.llama_server_args \(specreg\.yaml:\d+\)", origins["--jinja"])
    assert origins["--cache-type-k"] == origins["--jinja"]
    assert re.fullmatch(
        r"roles\.coder_escalation\.llama_server_args \(specreg\.yaml:\d+\)", origins["--mlock"]
    )
    script = export(site, "llama-server")
    assert f"#   --mlock  <- {origins['--mlock']}" in script
    assert run_function(script, "run_coder_escalation", tmp_path) == argv
    # a flag specreg writes itself is refused with its line
    role["llama_server_args"] = "--port 9000"
    write_yaml(site.spec, doc)
    code, _, err = run_cli(["export", "--format", "llama-server", "--spec", str(site.spec),
                            "--db", str(site.db)])  # fmt: skip
    assert code == 2 and "roles.coder_escalation.llama_server_args: specreg sets --port" in err
