"""`specreg propose` / `specreg apply`: measured runs become a reviewed change, comments kept."""

from __future__ import annotations

import difflib
import re

from ruamel.yaml import YAML

from specreg.declare.spec import load_spec

from support.declare import Site, pair_ids, record_run, run_cli

HAND_NOTE = "    # measured by hand 2026-02-13 on the EPYC: 11.0 tok/s; keep this witness"


def _measure(s: Site) -> list[int]:
    target, draft = pair_ids(s)
    for tps in (11.0, 11.2):
        record_run(s.db, target=target, draft=draft, k=16, tps=tps, acceptance=0.6)
    return [
        record_run(s.db, target=target, draft=draft, k=8, tps=t, acceptance=a)
        for t, a in ((12.4, 0.71), (12.6, 0.69), (12.5, 0.7))
    ]


def _annotate(s: Site) -> str:
    """Comments a user writes by hand: a line above the role, one after a value."""
    text = s.spec.read_text()
    text = text.replace("  coder_escalation:\n", "  coder_escalation:\n" + HAND_NOTE + "\n", 1)
    text = text.replace(
        "        draft_max: 16\n        evidence:\n          tokens_per_s: 11.01",
        "        draft_max: 16  # January sweep\n        evidence:\n          tokens_per_s: 11.01",
        1,
    )
    assert HAND_NOTE in text and "# January sweep" in text
    s.spec.write_text(text)
    load_spec(s.spec)
    return text


def test_propose_writes_a_reviewable_patch_and_changes_nothing(site: Site) -> None:
    runs = _measure(site)
    before = _annotate(site)
    out = site.spec.with_name("proposal.yaml")
    code, stdout, _ = run_cli(
        ["propose", "--spec", str(site.spec), "--db", str(site.db), "-o", str(out)]
    )
    assert code == 0, stdout
    assert site.spec.read_text() == before
    assert stdout.endswith(f"wrote {out}; review it, then `specreg apply {out}`\n")

    prop = YAML(typ="safe").load(out.read_text())
    assert prop["proposal"] == "specreg.proposal.v1"
    assert prop["must_not_apply_automatically"] is True
    (change,) = prop["changes"]
    assert change["key"] == "roles.coder_escalation.configs.default"
    assert change["was"]["draft_max"] == 16
    now = change["now"]
    assert (now["draft"], now["draft_max"]) == ("Qwen2.5-Coder-0.5B-Instruct", 8)
    ev = now["evidence"]
    assert ev["tokens_per_s"] == 12.5 and ev["acceptance"] == 0.7
    assert sorted(ev["runs"]) == sorted(str(r) for r in runs)
    assert (ev["host"], ev["protocol"]) == ("host-a", "code/n256/x3/t96")
    assert ev["date"].startswith("2026-11-20")
    assert change["why"].startswith(
        "draft-simple draft Qwen2.5-Coder-0.5B-Instruct draft_max 8: median 12.50 tok/s over "
        "3 run(s) beats the pinned 11.10 tok/s"
    )


def test_apply_keeps_comments_and_touches_only_the_change(site: Site) -> None:
    _measure(site)
    before = _annotate(site)
    out = site.spec.with_name("proposal.yaml")
    assert (
        run_cli(["propose", "--spec", str(site.spec), "--db", str(site.db), "-o", str(out)])[0] == 0
    )

    code, stdout, err = run_cli(["apply", str(out)])
    assert code == 0, err
    assert stdout == (f"updated roles.coder_escalation.configs.default\nwrote {site.spec}\n")
    after = site.spec.read_text()
    assert HAND_NOTE in after
    assert re.search(r"\n        draft_max: 8 +# January sweep\n", after), after
    assert after.startswith(before.split("\n", 1)[0])  # the header comment too

    changed = [
        line
        for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert all(
        any(
            k in line
            for k in (
                "draft_max",
                "tokens_per_s",
                "acceptance",
                "runs",
                "- '",
                "protocol",
                "host",
                "date",
                "source",
            )
        )
        for line in changed
    ), changed

    spec, _ = load_spec(site.spec)
    cfg = next(r for r in spec.roles if r.name == "coder_escalation").configs[0]
    assert cfg.draft_max == 8 and cfg.evidence.tokens_per_s == 12.5
    # the declaration now matches the measurements
    code, stdout, _ = run_cli(["plan", "--spec", str(site.spec), "--db", str(site.db)])
    assert code == 0, stdout


def test_a_stale_proposal_is_refused(site: Site) -> None:
    _measure(site)
    out = site.spec.with_name("proposal.yaml")
    assert (
        run_cli(["propose", "--spec", str(site.spec), "--db", str(site.db), "-o", str(out)])[0] == 0
    )
    assert run_cli(["apply", str(out)])[0] == 0
    text = site.spec.read_text()
    code, _, err = run_cli(["apply", str(out)])
    assert code == 2
    assert err.startswith(
        f"error: roles.coder_escalation.configs.default changed in {site.spec} since the "
        "proposal was written"
    )
    assert err.endswith(": propose again")
    assert site.spec.read_text() == text


def test_nothing_to_propose(site: Site) -> None:
    code, stdout, _ = run_cli(["propose", "--spec", str(site.spec), "--db", str(site.db)])
    assert (code, stdout) == (
        0,
        "nothing to propose: no measured run beats a pinned configuration\n",
    )
