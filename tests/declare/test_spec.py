"""specreg.yaml's schema: strict, with units, and errors that name file, line, key and remedy."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from specreg.cli.main import cli
from specreg.declare.spec import SpecFileError, dump_yaml, load_spec
from specreg.declare.templates import INIT_TEMPLATE
from specreg.declare.units import UnitError, acceptance_fraction, tokens_per_s
from specreg.errors import UsageError

GOOD = """\
# my collection
version: 1
llama:
  dialect: current
  threads: 96
roots: [/mnt/models]
models:
  08ec9e1ab3e664d7:   # the 30B coder
    path: /mnt/models/a.gguf
    aliases: [coder30]
  b293b27200927914:
    aliases: [coder-draft]
roles:
  coder:
    target: coder30
    policy: speed
    configs:
      default:
        draft: coder-draft
        draft_max: 16
        experts: 6
        evidence: {tokens_per_s: 47.11, acceptance: 0.701}
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "specreg.yaml"
    p.write_text(text, encoding="utf-8")
    return p


def error_of(tmp_path: Path, text: str) -> SpecFileError:
    with pytest.raises(SpecFileError) as info:
        load_spec(write(tmp_path, text))
    return info.value


def test_good_file_loads_with_units(tmp_path: Path) -> None:
    spec, _ = load_spec(write(tmp_path, GOOD))
    role = spec.roles[0]
    cfg = role.configs[0]
    assert (role.name, role.target, role.policy) == ("coder", "coder30", "speed")
    assert cfg.spec_types == ("draft-simple",)  # a draft implies draft-simple
    assert (cfg.draft, cfg.draft_max, cfg.experts) == ("coder-draft", 16, 6)
    assert cfg.evidence is not None and cfg.evidence.acceptance == pytest.approx(0.701)
    assert spec.model("coder30").id == "08ec9e1ab3e664d7"
    assert spec.model("b293b272") is not None  # an id prefix of 8+ characters
    assert (
        str(cfg.field_where("draft_max"))
        == "roles.coder.configs.default.draft_max (specreg.yaml:20)"
    )


def test_round_trip_keeps_comments_and_order(tmp_path: Path) -> None:
    _, doc = load_spec(write(tmp_path, GOOD))
    assert dump_yaml(doc) == GOOD.replace("roots: [/mnt/models]", "roots: [/mnt/models]")


@pytest.mark.parametrize(
    ("old", "new", "line", "key", "expected"),
    [
        (
            "draft_max: 16",
            "k: 16",
            20,
            "roles.coder.configs.default.k",
            "unknown key; K is spelled draft_max (drafted tokens per step)",
        ),
        (
            "draft_max: 16",
            "speculative_k: 16",
            20,
            "roles.coder.configs.default.speculative_k",
            "unknown key; K is spelled draft_max (drafted tokens per step)",
        ),
        (
            "draft_max: 16",
            "draft_max: 0",
            20,
            "roles.coder.configs.default.draft_max",
            "expected an integer 1..256 (drafted tokens per step), got 0",
        ),
        (
            "acceptance: 0.701",
            "acceptance: 70.1%",
            22,
            "roles.coder.configs.default.evidence.acceptance",
            "expected a number 0..1 (a fraction), got '70.1%' (write 0.701, not '70.1%')",
        ),
        (
            "acceptance: 0.701",
            "acceptance: 8.52",
            22,
            "roles.coder.configs.default.evidence.acceptance",
            "expected a number 0..1 (a fraction), got 8.52 (if 8.52 is a percentage, write 0.0852)",
        ),
        (
            "{tokens_per_s: 47.11,",
            "{tps: 47.11,",
            22,
            "roles.coder.configs.default.evidence.tps",
            "unknown key; spelled tokens_per_s",
        ),
        (
            "policy: speed",
            "policy: fast",
            16,
            "roles.coder.policy",
            "expected one of quality, speed, got 'fast'",
        ),
        (
            "target: coder30",
            "target: coder31",
            15,
            "roles.coder.target",
            "expected a model id or alias declared under models, got 'coder31'",
        ),
        (
            "aliases: [coder-draft]",
            "aliases: [coder30]",
            12,
            "models.b293b27200927914.aliases",
            "alias 'coder30' already names models.08ec9e1ab3e664d7 (one alias, one model)",
        ),
        (
            "    path: /mnt/models/a.gguf",
            "    quant: Q4_K_M",
            9,
            "models.08ec9e1ab3e664d7.quant",
            "unknown key; the quant is read from the GGUF header, not declared",
        ),
        (
            "threads: 96",
            "threads: lots",
            5,
            "llama.threads",
            "expected an integer 1..4096 (threads), got 'lots'",
        ),
    ],
)
def test_errors_name_file_line_key_and_expectation(
    tmp_path: Path, old: str, new: str, line: int, key: str, expected: str
) -> None:
    assert old in GOOD
    err = error_of(tmp_path, GOOD.replace(old, new))
    assert (err.line, err.key, err.expected) == (line, key, expected)
    assert str(err) == f"{tmp_path / 'specreg.yaml'}:{line}: {key}: {expected}"
    assert isinstance(err, UsageError)


def test_quality_policy_refuses_fewer_experts(tmp_path: Path) -> None:
    err = error_of(tmp_path, GOOD.replace("policy: speed", "policy: quality"))
    assert (err.line, err.expected) == (
        21,
        "policy quality runs all experts; remove experts or set policy: speed",
    )


def test_forbidden_family_is_refused(tmp_path: Path) -> None:
    text = GOOD.replace("    policy: speed\n", "    policy: speed\n    forbid: [draft]\n")
    err = error_of(tmp_path, text)
    assert err.expected == "draft-simple is forbidden for this role (forbid: draft)"


def test_duplicate_keys_are_an_error_not_last_one_wins(tmp_path: Path) -> None:
    text = GOOD.replace("        draft_max: 16\n", "        draft_max: 16\n        draft_max: 24\n")
    err = error_of(tmp_path, text)
    assert err.line == 21
    assert "duplicate key" in err.expected and "each fact is declared once" in err.expected


def test_missing_version(tmp_path: Path) -> None:
    err = error_of(tmp_path, GOOD.replace("version: 1\n", ""))
    assert (err.key, err.expected) == ("version", "missing (expected version: 1)")


def test_cli_exit_2_with_the_exact_line(tmp_path: Path) -> None:
    p = write(tmp_path, GOOD.replace("draft_max: 16", "draft_k: 16"))
    from specreg.cli.main import main  # noqa: F401  (the entry point maps errors to exit codes)

    result = CliRunner().invoke(cli, ["plan", "--spec", str(p)], standalone_mode=False)
    assert isinstance(result.exception, SpecFileError)
    assert str(result.exception) == (
        f"{p}:20: roles.coder.configs.default.draft_k: unknown key; "
        "K is spelled draft_max (drafted tokens per step)"
    )
    assert result.exception.exit_code == 2


def test_init_template_validates(tmp_path: Path) -> None:
    spec, _ = load_spec(write(tmp_path, INIT_TEMPLATE))
    assert spec.models == () and spec.roles == ()


@pytest.mark.parametrize(
    ("value", "fraction"),
    [("70.1%", 0.701), (8.52, 0.0852), (0.62, 0.62), ("0.55", 0.55), (74, 0.74), (1, 1.0)],
)
def test_acceptance_spellings_become_a_fraction(value: object, fraction: float) -> None:
    assert acceptance_fraction(value) == pytest.approx(fraction)


@pytest.mark.parametrize("value", ["1.61x", "high", "101%", True, None])
def test_acceptance_refuses_what_it_cannot_read(value: object) -> None:
    with pytest.raises(UnitError):
        acceptance_fraction(value)


def test_speed_refuses_ranges_and_ratios() -> None:
    assert tokens_per_s("47.11 t/s") == 47.11
    for bad in ("14.4-20.8", "1.61x"):
        with pytest.raises(UnitError):
            tokens_per_s(bad)


def test_init_writes_a_skeleton_once(tmp_path: Path) -> None:
    from support.declare import run_cli

    p = tmp_path / "specreg.yaml"
    assert run_cli(["init", "--spec", str(p)]) == (0, f"wrote {p}\n", "")
    assert p.read_text() == INIT_TEMPLATE
    code, _, err = run_cli(["init", "--spec", str(p)])
    assert (code, err) == (2, f"error: {p} exists; edit it, or pass --spec NEW.yaml")


SET = GOOD.replace(
    """    configs:
      default:
        draft: coder-draft
        draft_max: 16
        experts: 6
        evidence: {tokens_per_s: 47.11, acceptance: 0.701}
""",
    """    configs:
      code:                 # a candidate set: serve --policy adaptive chooses per request
        - spec_type: none
        - spec_type: ngram-mod
          draft_max: 16
        - draft: coder-draft
          draft_max: 8
      default:
        spec_type: none
""",
)


def test_a_list_under_a_task_is_a_candidate_set(tmp_path: Path) -> None:
    spec, _ = load_spec(write(tmp_path, SET))
    configs = spec.roles[0].configs
    code = [c for c in configs if c.task == "code"]
    assert [(c.member, c.spec_types, c.draft_max) for c in code] == [
        (0, ("none",), None),
        (1, ("ngram-mod",), 16),
        (2, ("draft-simple",), 8),
    ]
    assert [c.name for c in code] == ["code[0]", "code[1]", "code[2]"]
    assert str(code[2].field_where("draft_max")) == (
        "roles.coder.configs.code[2].draft_max (specreg.yaml:23)"
    )
    default = [c for c in configs if c.task == "default"]
    assert [(c.member, c.name) for c in default] == [(None, "default")]


def test_a_candidate_set_of_one_is_refused(tmp_path: Path) -> None:
    err = error_of(
        tmp_path, SET.replace("        - spec_type: none\n        - spec_type: ngram-mod\n"
                              "          draft_max: 16\n", "")
    )  # fmt: skip
    assert (err.key, err.line) == ("roles.coder.configs.code", 18)
    assert err.expected == (
        "expected a candidate set of two or more configurations (one is written as a "
        "mapping, without the list)"
    )


def test_a_candidate_set_names_each_configuration_once(tmp_path: Path) -> None:
    same = "spec_type: [ngram-mod]\n          draft_max: 16"
    err = error_of(tmp_path, SET.replace("draft: coder-draft\n          draft_max: 8", same))
    assert (err.key, err.line) == ("roles.coder.configs.code[2]", 22)
    assert (
        err.expected == "expected each configuration once (roles.coder.configs.code[1] is the same)"
    )


def test_a_member_is_checked_as_a_configuration_is(tmp_path: Path) -> None:
    err = error_of(tmp_path, SET.replace("draft_max: 8", "k: 8"))
    assert (err.key, err.line) == ("roles.coder.configs.code[2].k", 23)
    assert "K is spelled draft_max" in err.expected


def test_llama_server_args_per_model_and_role(tmp_path: Path) -> None:
    """Issue 41 point 14: llama-server flags of the user's own, for a target wherever it runs
    and for a role; a flag specreg sets itself is refused at its line."""
    text = GOOD.replace(
        "    aliases: [coder30]\n",
        "    aliases: [coder30]\n    llama_server_args: [--jinja, --cache-type-k q8_0]\n",
    ).replace("    policy: speed\n", "    policy: speed\n    llama_server_args: --mlock\n")
    spec, _ = load_spec(write(tmp_path, text))
    model = spec.model("coder30")
    assert model is not None and model.server_args is not None
    assert model.server_args.args == ("--jinja", "--cache-type-k", "q8_0")
    assert (
        str(model.server_args.where)
        == "models.08ec9e1ab3e664d7.llama_server_args (specreg.yaml:11)"
    )
    role = spec.roles[0]
    assert role.server_args is not None and role.server_args.args == ("--mlock",)
    err = error_of(tmp_path, text.replace("--mlock", "[--mlock, -c 8192]"))
    assert (err.line, err.key) == (18, "roles.coder.llama_server_args")
    assert err.expected == "specreg sets -c itself, the context per request (--ctx); leave it out"
    err = error_of(tmp_path, text.replace("    llama_server_args: --mlock", "    server_args: x"))
    assert err.expected == "unknown key; spelled llama_server_args"
