"""Results of the auditor: every verdict carries its checks, their numbers and real remedies."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Verdict(str, enum.Enum):
    COMPATIBLE = "compatible"
    WARNINGS = "compatible-with-warnings"
    RISKY = "passes-llama-check-risky"
    INCOMPATIBLE = "incompatible"

    @property
    def text(self) -> str:
        return _VERDICT_TEXT[self]

    @property
    def rank(self) -> int:
        """Smaller is better: sorts drafts and picks the worst of several verdicts."""
        return _ORDER.index(self)


_ORDER = (Verdict.COMPATIBLE, Verdict.WARNINGS, Verdict.RISKY, Verdict.INCOMPATIBLE)
_VERDICT_TEXT = {
    Verdict.COMPATIBLE: "compatible",
    Verdict.WARNINGS: "compatible with warnings",
    Verdict.RISKY: "passes llama.cpp's check, risky at run time",
    Verdict.INCOMPATIBLE: "incompatible",
}


class Severity(str, enum.Enum):
    """What a failed check does to the verdict."""

    BLOCKS = "blocks"  # llama.cpp refuses the pair (or cannot speculate with it)
    RISK = "risk"  # llama.cpp accepts; practitioners hit a failure at run time
    WARNS = "warns"  # works, but worse than it could
    INFO = "info"  # never changes the verdict


_SEVERITY_VERDICT = {
    Severity.BLOCKS: Verdict.INCOMPATIBLE,
    Severity.RISK: Verdict.RISKY,
    Severity.WARNS: Verdict.WARNINGS,
    Severity.INFO: Verdict.COMPATIBLE,
}


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    severity: Severity
    message: str
    values: dict[str, Any] = field(default_factory=dict, hash=False, compare=True)
    llama_check: bool = False
    """Part of llama.cpp's own `common_speculative_are_compatible`."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "passed": self.passed,
            "severity": self.severity.value,
            "llama_check": self.llama_check,
            "message": self.message,
            "values": self.values,
        }


@dataclass(frozen=True)
class ModelRef:
    model_id: str
    name: str
    path: str

    @property
    def label(self) -> str:
        return self.name or self.path


@dataclass(frozen=True)
class PairVerdict:
    JSON_KIND = "compat"
    # 2: "not_a_draft" (why the draft cannot make the target faster, or null)
    JSON_VERSION = "2"

    target: ModelRef
    draft: ModelRef
    verdict: Verdict
    llama_accepts: bool | None
    """What llama.cpp's vocabulary check returns; None where it does not apply (bound drafts)."""
    checks: tuple[Check, ...]
    remedies: tuple[str, ...]
    rules_label: str
    llama_build: int
    spec_type: str | None
    """The --spec-type this pair runs with (draft-simple, draft-eagle3, ...), None if it cannot."""
    flags: tuple[str, ...] = ()
    not_a_draft: str | None = None
    """Why the draft is no draft for the target whatever llama.cpp says (`pairs.not_a_draft`:
    the target itself, or as large as it): set by `check_pair`, None otherwise."""

    @property
    def compatible(self) -> bool:
        return self.verdict in (Verdict.COMPATIBLE, Verdict.WARNINGS)

    @property
    def same_model(self) -> bool:
        """Target and draft are one model (one file, or the same GGUF under two names)."""
        return self.target.model_id == self.draft.model_id

    @property
    def failed(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.passed and c.severity is not Severity.INFO)

    @property
    def warnings(self) -> tuple[str, ...]:
        return tuple(c.message for c in self.failed if c.severity is Severity.WARNS)

    @property
    def reasons(self) -> tuple[str, ...]:
        """Why the verdict is not `compatible`: the worst failed checks' messages."""
        worst = [c for c in self.failed if _SEVERITY_VERDICT[c.severity] is self.verdict]
        return tuple(c.message for c in worst)

    def check(self, name: str) -> Check:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def as_dict(self) -> dict[str, Any]:
        return {
            "target": {
                "id": self.target.model_id,
                "name": self.target.name,
                "path": self.target.path,
            },
            "draft": {"id": self.draft.model_id, "name": self.draft.name, "path": self.draft.path},
            "compatible": self.compatible,
            "verdict": self.verdict.value,
            "verdict_text": self.verdict.text,
            "llama_accepts": self.llama_accepts,
            "spec_type": self.spec_type,
            "flags": list(self.flags),
            "llama_build": self.llama_build,
            "rules": self.rules_label,
            "reasons": list(self.reasons),
            "warnings": list(self.warnings),
            "remedies": list(self.remedies),
            "checks": [c.as_dict() for c in self.checks],
        }

    def to_json(self) -> dict[str, Any]:
        from specreg.jsonout import document

        payload = {
            **self.as_dict(),
            "same_model": self.same_model,
            "not_a_draft": self.not_a_draft,
        }
        return document(self.JSON_KIND, self.JSON_VERSION, payload)


@dataclass(frozen=True)
class NotADraft:
    """A model llama.cpp would take as a draft for the target, as large as it or larger."""

    pair: PairVerdict
    why: str


@dataclass(frozen=True)
class DraftList:
    """`specreg drafts`: every draft for a target, best first, and its draftless modes."""

    JSON_KIND = "drafts"
    # 2: "target" is the resolved model (id, name, path), not the argument
    # 3: models as large as the target or larger are not in "drafts" but in "not_drafts"
    JSON_VERSION = "3"

    target: ModelRef
    draftless: tuple[str, ...]
    """Speculative types that need no draft file (MTP heads, n-gram modes)."""
    spec_type_flag: str
    """How these rules' llama.cpp selects a speculative type (`--spec-type`)."""
    drafts: tuple[PairVerdict, ...]
    agreement: dict[str, dict[str, float | None]] = field(default_factory=dict)
    """Draft id -> task -> same top token with the target (`specreg agree`); {} if none."""
    not_drafts: tuple[NotADraft, ...] = ()
    """Models as large as the target or larger: never ranked among the drafts."""

    def to_json(self) -> dict[str, Any]:
        from specreg.jsonout import document

        target = {"id": self.target.model_id, "name": self.target.name, "path": self.target.path}
        payload = {
            "target": target,
            "draftless": self.draftless,
            "drafts": [
                {**pv.as_dict(), "agreement": self.agreement.get(pv.draft.model_id, {})}
                for pv in self.drafts
            ],
            "not_drafts": [{**n.pair.as_dict(), "why": n.why} for n in self.not_drafts],
        }
        return document(self.JSON_KIND, self.JSON_VERSION, payload)


def verdict_of(checks: tuple[Check, ...] | list[Check]) -> Verdict:
    worst = Verdict.COMPATIBLE
    for c in checks:
        if not c.passed:
            v = _SEVERITY_VERDICT[c.severity]
            if v.rank > worst.rank:
                worst = v
    return worst
