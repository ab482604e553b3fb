"""A draft the auditor already knows cannot speculate for the target is refused before
llama.cpp starts (issue 25, point 12): the user gets the auditor's reason and remedy in a
second, not a failed run after a model load. `--force` runs it anyway, for llama.cpp's word."""

from __future__ import annotations

from typing import TYPE_CHECKING

from specreg.errors import UsageError, param

if TYPE_CHECKING:
    import duckdb

    from specreg.llama.install import LlamaInstall
    from specreg.registry.queries import ModelRecord


class IncompatibleDraft(UsageError):
    """The auditor, applying the rules of the llama.cpp that would run, refuses the pair."""


def refuse_incompatible_draft(
    con: duckdb.DuckDBPyConnection,
    install: LlamaInstall,
    target: ModelRecord,
    draft: ModelRecord,
    spec_type: str | None = None,
) -> None:
    """Raise `IncompatibleDraft` with the auditor's reasons and remedies when `draft` cannot
    draft for `target` under the rules of `install`'s build, or cannot draft as `spec_type` (a
    plain model as draft-eagle3, a head as draft-simple); return quietly otherwise."""
    from specreg.auditor import Verdict, check_pair, rules_for_version, spec_type_refusal

    wrong_kind = spec_type_refusal(
        spec_type, draft, f"{draft.display_name} ({draft.model_id[:10]})"
    )
    if wrong_kind is not None:
        raise IncompatibleDraft(f"{wrong_kind} ({param('force')} runs it anyway)")
    pv = check_pair(con, target, draft, rules_for_version(install.version, install.dialect))
    if pv.verdict is not Verdict.INCOMPATIBLE:
        return
    why = "; ".join(pv.reasons) or pv.verdict.text
    remedy = f"; remedy: {pv.remedies[0]}" if pv.remedies else ""
    raise IncompatibleDraft(
        f"{draft.display_name} ({draft.model_id[:10]}) cannot draft for {target.display_name}"
        f" with llama.cpp {pv.rules_label}: {why}{remedy} ({param('force')} runs it anyway, to hear"
        " llama.cpp's own word)"
    )
