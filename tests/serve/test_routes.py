"""Route planning (pinned in specreg.yaml, else recommended), the dry run, and the front's own
answers (413, 404, 400, 503) - nothing here starts llama.cpp."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from specreg.cli.main import cli
from specreg.errors import UsageError
from specreg.host.machine import detect_host
from specreg.llama.config import Config
from specreg.llama.install import LlamaInstall
from specreg.registry.db import opened
from specreg.registry.run_store import list_runs
from specreg.registry.scan import model_record
from specreg.samples.small_models import SmallModels
from specreg.serve.app import Service
from specreg.serve.recorder import RunRecorder
from specreg.serve.routes import DEFAULT_PARALLEL, RouteTable, Shape, Target, plan_routes
from specreg.serve.serving import is_loopback
from specreg.terms import TASKS

from support.declare import smollm2_spec
from support.serve import front_without_backend

SPEC = smollm2_spec("""\
      code:
        spec_type: ngram-mod
        draft_max: 8
      default:
        spec_type: none
""")


def write_spec(tmp_path: Path, db: Path, model: Path) -> Path:
    with opened(db) as con:
        rec = model_record(con, model)
    spec = tmp_path / "specreg.yaml"
    spec.write_text(SPEC.format(model_id=rec.model_id, path=model))
    return spec


def dry_run(
    tmp_path: Path, home: Path, models: SmallModels, llama: LlamaInstall, *extra: str
) -> dict:  # type: ignore[type-arg]
    """`specreg serve --spec SPEC --dry-run --json` with SmolLM2 pinned as in SPEC."""
    spec = write_spec(tmp_path, home / "registry.duckdb", models.smollm2.path)
    result = CliRunner().invoke(
        cli,
        ["serve", "--spec", str(spec), "--dry-run", "--json", "--llama-bin",
         str(llama.bin_dir), *extra],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.output))


def test_pinned_configs_route_code_to_ngram_and_share_the_plain_backend(
    tmp_path: Path, specreg_home: Path, llama_install: LlamaInstall, small_models: SmallModels
) -> None:
    db = specreg_home / "registry.duckdb"
    spec_path = write_spec(tmp_path, db, small_models.smollm2.path)
    from specreg.declare.spec import load_spec
    from specreg.host.facts import HostFacts
    from specreg.recommender.advisor import open_advisor

    spec = load_spec(spec_path)[0]
    with opened(db) as con:
        advisor = open_advisor(con, HostFacts(30.0, 2, "user"))
        table = plan_routes(
            con, llama_install, detect_host(), advisor, [], spec=spec, shape=Shape(threads=1)
        )
    assert [t.name for t in table.targets] == ["smollm2"]
    by_task = {r.task: r for r in table.routes}
    assert set(by_task) == set(TASKS)
    assert by_task["code"].config_label == "ngram-mod k=8"
    assert by_task["code"].source == "pinned"
    assert "roles.assistant.configs.code (specreg.yaml:" in by_task["code"].reason
    assert {by_task[t].config_label for t in TASKS if t != "code"} == {"plain"}
    assert len(table.backends) == 2  # five tasks share one plain backend
    ngram = table.backend(by_task["code"].backend)
    assert ngram.flags[ngram.flags.index("--spec-type") + 1] == "ngram-mod"
    assert ngram.flags[ngram.flags.index("-t") + 1] == "1"
    assert ngram.command.endswith("--host 127.0.0.1 --port PORT")


def test_without_a_pin_every_task_gets_the_top_recommendation(
    specreg_home: Path, llama_install: LlamaInstall, small_models: SmallModels
) -> None:
    from specreg.host.facts import HostFacts
    from specreg.recommender.advisor import open_advisor

    path = small_models.smollm2.path
    with opened(specreg_home / "registry.duckdb") as con:
        model_record(con, path)
        advisor = open_advisor(con, HostFacts(30.0, 2, "user"))
        table = plan_routes(con, llama_install, detect_host(), advisor, [str(path)])
        for task in TASKS:
            best = advisor.recommend(con, str(path), task=task).best
            route = table.route(table.targets[0].name, task)
            assert route.source == "recommended"
            assert route.config_label == Config(spec_type=best.spec_type, k=best.k).label
    labels = {r.config_label for r in table.routes}
    assert len(table.backends) == len(labels)  # one backend per distinct configuration


def test_dry_run_json_lists_routes_and_commands(
    tmp_path: Path, specreg_home: Path, small_models: SmallModels, llama_install: LlamaInstall
) -> None:
    doc = dry_run(
        tmp_path, specreg_home, small_models, llama_install, "--threads", "1", "--policy",
        "adaptive",
    )  # fmt: skip
    assert (doc["version"], doc["kind"]) == ("7", "serve-routes")
    assert set(doc) == {
        "version", "kind", "targets", "routes", "backends", "notes", "policy", "candidates",
        "noise", "figures", "replicas",
    }  # fmt: skip
    assert doc["replicas"] == []  # no capacity measured on this host: no split replicas
    # the host's figures the recommendations used, each with where it came from
    assert doc["noise"]["source"] in ("measured", "fallback")
    assert doc["figures"] and all("noise floor" in f for f in doc["figures"])
    # pins stay pins under the adaptive policy: one candidate per task, the pinned one
    assert doc["policy"] == "adaptive"
    assert {(c["task"], c["label"], c["origin"]) for c in doc["candidates"]} == {
        *((t, "plain", "pinned") for t in ("prose", "summarize", "json", "math", "chat")),
        ("code", "ngram-mod k=8", "pinned"),
    }
    assert set(doc["routes"][0]) == {
        "target", "task", "backend", "config_label", "source", "reason"
    }  # fmt: skip
    assert set(doc["backends"][0]) == {
        "name", "target", "config", "config_label", "draft_path", "argv", "command", "slots",
        "ctx", "server_args", "placement", "tasks",
    }  # fmt: skip
    # every backend on this host's full core set, one thread per core, four slots
    import os

    for b in doc["backends"]:
        place = b["placement"]
        assert place["name"] == "full" and set(place["cpus"]) <= os.sched_getaffinity(0)
        assert b["slots"] == DEFAULT_PARALLEL == 8
        assert b["argv"][b["argv"].index("-np") + 1] == "8"
        assert b["argv"][b["argv"].index("-tb") + 1] == "1"  # --threads 1 given
    tasks = {b["config_label"]: b["tasks"] for b in doc["backends"]}
    assert tasks == {
        "plain": ["prose", "summarize", "json", "math", "chat"],
        "ngram-mod k=8": ["code"],
    }


CANDIDATE_SET = SPEC.replace(
    """      code:
        spec_type: ngram-mod
        draft_max: 8
""",
    """      code:
        - spec_type: none
        - spec_type: ngram-mod
          draft_max: 8
""",
)


def test_a_candidate_set_in_specreg_yaml_is_the_tasks_candidates(
    tmp_path: Path, specreg_home: Path, small_models: SmallModels, llama_install: LlamaInstall
) -> None:
    db = specreg_home / "registry.duckdb"
    spec = write_spec(tmp_path, db, small_models.smollm2.path)
    spec.write_text(
        spec.read_text().replace(SPEC.split("roles:")[1], CANDIDATE_SET.split("roles:")[1])
    )
    base = ["serve", "--spec", str(spec), "--dry-run", "--llama-bin", str(llama_install.bin_dir)]
    result = CliRunner().invoke(cli, [*base, "--json", "--policy", "adaptive"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert {(c["task"], c["label"], c["kind"], c["origin"]) for c in doc["candidates"]} == {
        *((t, "plain", "plain", "pinned") for t in ("prose", "summarize", "json", "math", "chat")),
        ("code", "plain", "plain", "pinned"),
        ("code", "ngram-mod k=8", "ngram", "pinned"),
    }
    code = next(r for r in doc["routes"] if r["task"] == "code")
    assert code["reason"] == (
        f"candidate set pinned in roles.assistant.configs.code ({spec.name}:11) (role assistant)"
    )
    # the fixed policy serves one configuration a task: a set is refused, with where it is
    fixed = CliRunner().invoke(cli, [*base, "--policy", "fixed"])
    assert isinstance(fixed.exception, UsageError) and fixed.exception.exit_code == 2
    assert str(fixed.exception) == (
        f"candidate set pinned in roles.assistant.configs.code ({spec.name}:11) (role "
        "assistant): serve it with --policy adaptive, or pin one configuration"
    )


def test_nothing_to_serve_is_a_usage_error(specreg_home: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["serve", "--spec", str(tmp_path / "none.yaml"), "--dry-run"])
    assert isinstance(result.exception, UsageError) and result.exception.exit_code == 2
    assert str(result.exception) == (
        "nothing to serve: give a TARGET (model path, name or id), or a specreg.yaml with "
        "roles (--spec)"
    )


def test_only_loopback_is_loopback() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("127.0.0.2") and is_loopback("::1")
    assert is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")


# -- the front's own answers, with a backend that never becomes ready ------------------------


@pytest.fixture
def service(tmp_path: Path, specreg_home: Path) -> Service:
    return front_without_backend(
        tmp_path, recorder=RunRecorder(specreg_home / "registry.duckdb"), max_body=2000
    )


def test_front_answers_without_a_backend(service: Service, specreg_home: Path) -> None:
    from starlette.testclient import TestClient

    client = TestClient(service.app)
    assert client.get("/v1/models").json()["data"][0]["id"] == "tiny"
    health = client.get("/health")
    assert health.status_code == 503
    assert health.json()["backends"] == [{"name": "tiny-plain", "ready": False, "starts": 0}]

    big = client.post("/v1/completions", json={"prompt": "x" * 3000})
    assert big.status_code == 413
    assert big.json()["error"]["message"] == (
        "request body larger than 2000 bytes (serve --max-body)"
    )
    assert client.post("/v1/completions", content=b"{not json").status_code == 400
    assert client.post("/v1/completions", json=[1, 2]).status_code == 400
    forced = client.post(
        "/v1/completions", json={"prompt": "hi"}, headers={"X-Specreg-Task": "poetry"}
    )
    assert (
        forced.status_code == 400 and "unknown task 'poetry'" in forced.json()["error"]["message"]
    )

    down = client.post(
        "/v1/chat/completions",
        json={"model": "tiny:math", "messages": [{"role": "user", "content": "2+2?"}]},
    )
    assert down.status_code == 503
    assert down.headers["x-specreg-backend"] == "tiny-plain"
    assert down.headers["x-specreg-task"] == "math"
    assert down.headers["x-specreg-task-source"] == "model"
    assert down.json()["error"]["message"] == "backend tiny-plain was not ready within 0 s"

    # The refused request is a recorded, failed run with its task and configuration.
    assert service.recorder is not None
    service.recorder.flush()
    with opened(specreg_home / "registry.duckdb") as con:
        (run,) = list_runs(con, with_prompts=True)
    assert (run.kind, run.status, run.task, run.config_label) == (
        "serve",
        "failed",
        "math",
        "plain",
    )
    assert run.error_kind == "unavailable"
    assert run.regime == "warm" and run.config["task_source"] == "model"
    assert run.protocol is not None
    assert (run.protocol["isolation"], run.protocol["keeps_state"]) == ("served-traffic", False)
    assert run.prompts[0].prompt_id == "request"


def test_unknown_model_among_several_targets_is_404(service: Service) -> None:
    from starlette.testclient import TestClient

    other = Target("other", "e" * 32, "/models/other.gguf")
    service.table = RouteTable((*service.table.targets, other), service.table.routes,
                               service.table.backends)  # fmt: skip
    got = TestClient(service.app).post("/v1/completions", json={"model": "gpt-4", "prompt": "hi"})
    assert got.status_code == 404
    assert got.json()["error"]["message"] == "unknown model 'gpt-4': this server has tiny, other"


def test_a_non_loopback_address_needs_a_key_or_public_on_purpose(
    tmp_path: Path, specreg_home: Path, small_models: SmallModels, llama_install: LlamaInstall
) -> None:
    spec = write_spec(tmp_path, specreg_home / "registry.duckdb", small_models.smollm2.path)
    args = ["serve", "--spec", str(spec), "--dry-run", "--llama-bin", str(llama_install.bin_dir)]
    bare = CliRunner().invoke(cli, [*args, "--host", "0.0.0.0"])
    assert isinstance(bare.exception, UsageError) and bare.exception.exit_code == 2
    assert str(bare.exception) == (
        "--host 0.0.0.0 is reachable from other machines: give --api-key KEY (or --api-keys "
        "FILE) so only clients with a key get in, or --public to let anyone use these models"
    )
    public = CliRunner().invoke(cli, [*args, "--host", "0.0.0.0", "--public"])
    assert public.exit_code == 0, public.output
    assert public.stderr.startswith(
        "warning: listening on 0.0.0.0 without a key (--public): anyone who can reach this "
        "machine can use these models"
    )
    keyed = CliRunner().invoke(cli, [*args, "--host", "0.0.0.0", "--api-key", "s3cret"])
    assert keyed.exit_code == 0 and keyed.stderr == ""
    keys = tmp_path / "keys.txt"
    keys.write_text("# the team's keys\n\n")
    empty = CliRunner().invoke(cli, [*args, "--host", "0.0.0.0", "--api-keys", str(keys)])
    assert str(empty.exception) == f"--api-keys {keys}: no key in it (one a line, # for comments)"
    assert CliRunner().invoke(cli, [*args, "--host", "127.0.0.1"]).stderr == ""


def test_pins_on_the_command_line() -> None:
    from specreg.serve.routes import Pin, parse_pin

    assert parse_pin("code=ngram-mod:8") == Pin("code", "ngram-mod", 8, None, "code=ngram-mod:8")
    assert parse_pin("summary=draft-simple:4@small.gguf").draft == "small.gguf"
    assert parse_pin("default=none").task == "default"
    with pytest.raises(UsageError) as err:
        parse_pin("code:ngram-mod")
    assert str(err.value) == (
        "--pin 'code:ngram-mod': write TASK=SPEC_TYPE[:K][@DRAFT], e.g. code=ngram-mod:8"
    )
    with pytest.raises(UsageError, match="the task is one of code, prose"):
        parse_pin("poetry=none")


def test_a_pin_wins_over_specreg_yaml(
    tmp_path: Path, specreg_home: Path, small_models: SmallModels, llama_install: LlamaInstall
) -> None:
    doc = dry_run(tmp_path, specreg_home, small_models, llama_install, "--pin", "code=ngram-simple")
    routes = {r["task"]: r for r in doc["routes"]}
    assert routes["code"]["config_label"] == "ngram-simple"
    assert routes["code"]["reason"] == "pinned by --pin code=ngram-simple"
    assert routes["prose"]["reason"].startswith("pinned in roles.assistant.configs.default")


def test_an_api_key_is_needed_everywhere_but_health(service: Service) -> None:
    import openai
    from starlette.testclient import TestClient

    keyed = Service(
        service.table, service.pool, service.classifier, templates=service.templates,
        keys=frozenset({"k-one", "k-two"}),
    )  # fmt: skip
    client = TestClient(keyed.app)
    bare = client.get("/v1/models")
    assert bare.status_code == 401 and bare.headers["www-authenticate"] == "Bearer"
    assert bare.json()["error"] == {
        "message": "no API key: send Authorization: Bearer KEY with a key this server was "
        "started with (serve --api-key)",
        "type": "invalid_request_error",
        "code": "invalid_api_key",
    }
    wrong = client.get("/v1/models", headers={"Authorization": "Bearer k-three"})
    assert wrong.status_code == 401 and wrong.json()["error"]["message"].startswith("a wrong")
    for headers in ({"Authorization": "Bearer k-two"}, {"X-Api-Key": "k-one"}):
        assert client.get("/v1/models", headers=headers).json()["data"][0]["id"] == "tiny"
    assert client.get("/health").status_code == 503  # open (and degraded: nothing started)
    assert client.post("/v1/completions", json={"prompt": "hi"}).status_code == 401
    # the openai client sends its api_key as a bearer token
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="k-one", http_client=client)
    assert [m.id for m in sdk.models.list()] == ["tiny"]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url="http://testserver/v1", api_key="nope", http_client=client
        ).models.list()


def test_a_dry_run_needs_no_llama_cpp(
    tmp_path: Path, specreg_home: Path, small_models: SmallModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A laptop plans for a big host: no build anywhere, the pinned build's flags assumed."""
    db = specreg_home / "registry.duckdb"
    with opened(db) as con:
        model_record(con, small_models.smollm2.path)
    monkeypatch.setenv("SPECREG_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.delenv("SPECREG_LLAMA_BIN", raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    args = ["serve", str(small_models.smollm2.path), "--dry-run", "--cores", "96",
            "--bandwidth", "460", "--json"]  # fmt: skip
    got = CliRunner().invoke(cli, args)
    assert got.exit_code == 0, got.output
    doc = json.loads(got.stdout)
    (backend, *_) = doc["backends"]
    assert "llama-server" in backend["argv"]  # by name: found on PATH when it runs
    assert backend["placement"]["threads"] == 96  # the stated host's cores, one thread each
    # without --dry-run it still needs a build, and says how to get one
    served = CliRunner().invoke(cli, args[:2] + ["--port", "18999"])
    assert served.exit_code != 0 and "specreg llama build" in str(served.exception)
