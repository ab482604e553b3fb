"""Compare a configuration with the plain baseline: same tokens (up to numerics), faster?

On CPU, greedy speculative output need not equal the baseline token for token: verifying
K tokens in one batch changes the arithmetic, and near-tied logits can flip. So a divergence
is judged by the top probabilities at its position, in both runs: near-tied candidates are
"equivalent up to numerics" (with the margin), a confident divergence fails.

The legacy engines (llama-speculative, llama-lookup) print text, not token ids, so their
output is compared as text over the common length (they overshoot n_predict). At a text
divergence the baseline's own top candidates at that token (n_probs) are matched against the
legacy text: if one of them spells how the legacy run went on and is near-tied with the
baseline's token, the divergence is a near-tie as on the server; otherwise it fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specreg.runner.measure import ENGINE_SERVER
from specreg.runner.measurement import Measurement, PromptResult, first_divergence

# A divergence is a numerical near-tie when the baseline preferred its token by at most this
# much probability, or by no more than the margin moves between two computations of the same
# position (measured: batch shape moves gemma-3-270m's top-2 margin by up to 0.14 on CPU).
NEAR_TIE_MARGIN = 0.10
# ...but a baseline this sure is never a near-tie, whatever noise the re-decode suggests.
NEAR_TIE_CAP = 0.25

IDENTICAL = "identical"
NEAR_TIE = "near-tie"
DIVERGED = "diverged"
CHANGED = "changed"  # behaviour-changing config: divergence is expected, only measured
TEXT_IDENTICAL = "text-identical"  # legacy engines: same text over the common length
TEXT_DIVERGED = "text-diverged"  # legacy engines: not explained by a near-tie
TEXT_CONTEXT = 40  # characters of each continuation shown from a text divergence


@dataclass(frozen=True)
class PromptVerdict:
    prompt_id: str
    verdict: str
    position: int | None = None
    baseline_token: int | None = None
    config_token: int | None = None
    baseline_probs: tuple[float | None, float | None] = (None, None)  # (base tok, cfg tok)
    config_probs: tuple[float | None, float | None] = (None, None)
    margin: float | None = None  # baseline p(its token) - p(config's token)
    noise: float | None = None  # how far that margin moves between two computations
    baseline_text: str = ""
    config_text: str = ""
    unit: str = "token"  # what `position` counts: token, or char for legacy engines

    def to_json(self) -> dict[str, Any] | None:
        if self.position is None:
            return None
        return {
            "position": self.position,
            "unit": self.unit,
            "baseline_token": self.baseline_token,
            "config_token": self.config_token,
            "baseline_probs": list(self.baseline_probs),
            "config_probs": list(self.config_probs),
            "margin": self.margin,
            "noise": self.noise,
            "baseline_text": self.baseline_text,
            "config_text": self.config_text,
        }


@dataclass(frozen=True)
class Verification:
    baseline: Measurement
    config: Measurement
    prompts: tuple[PromptVerdict, ...]
    verdict: str  # pass | fail
    reason: str
    speedup: float | None
    speedup_range: tuple[float, float] | None

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def slower(self) -> bool:
        return self.speedup is not None and self.speedup < 1.0

    @property
    def label(self) -> str:
        return "behaviour-changing" if self.config.config.behaviour_changing else "lossless"


@dataclass(frozen=True)
class TextTie:
    """The baseline's candidates at the token where a text divergence starts."""

    token_index: int
    baseline_token: int
    baseline_p: float
    config_token: int | None  # the candidate that spells the config's text there, if any
    config_p: float | None


def text_tie(base: PromptResult, char_pos: int, config_text: str) -> TextTie | None:
    """Find the baseline token holding `char_pos` and the candidate the config took instead.

    Uses the baseline's reference run (top candidates at every position). None when the
    reference is missing or does not spell the same text up to `char_pos`.
    """
    ref = base.reference
    if ref is None or not ref.probs or not base.samples:
        return None
    if ref.content[:char_pos] != base.samples[0].content[:char_pos]:
        return None
    offset = 0
    for j, tp in enumerate(ref.probs):
        piece = next((text for tid, text, _ in tp.top if tid == tp.token), None)
        if piece is None:
            return None
        if offset + len(piece) > char_pos:
            rest = config_text[offset:]
            p_base = tp.prob(tp.token) or 0.0
            spelled = [
                (len(text), tid, p)
                for tid, text, p in tp.top
                if tid != tp.token and text and rest.startswith(text)
            ]
            if not spelled:
                return TextTie(j, tp.token, p_base, None, None)
            _, tid, p = max(spelled)
            return TextTie(j, tp.token, p_base, tid, p)
        offset += len(piece)
    return None


def _judge_text(base: PromptResult, cfg: PromptResult, lossless: bool) -> PromptVerdict:
    pid = base.prompt.prompt_id
    sa, sb = base.samples[0], cfg.samples[0]
    a, b = sa.content, sb.content
    n = min(len(a), len(b))
    pos = next((i for i in range(n) if a[i] != b[i]), None)
    if pos is None and len(a) != len(b):
        # Running past the shorter text is overshoot (or n_predict); stopping short at the
        # end of text while the other went on is a difference.
        shorter = sa if len(a) < len(b) else sb
        pos = n if shorter.stop_type == "eos" else None
    if pos is None:
        return PromptVerdict(pid, TEXT_IDENTICAL)
    tie = text_tie(base, pos, b)
    margin = None
    if tie is not None and tie.config_p is not None:
        margin = tie.baseline_p - tie.config_p
    verdict = CHANGED
    if lossless:
        verdict = NEAR_TIE if margin is not None and margin <= NEAR_TIE_MARGIN else TEXT_DIVERGED
    return PromptVerdict(
        prompt_id=pid,
        verdict=verdict,
        position=pos,
        baseline_token=tie.baseline_token if tie else None,
        config_token=tie.config_token if tie else None,
        baseline_probs=(tie.baseline_p, tie.config_p) if tie else (None, None),
        margin=margin,
        baseline_text=a[pos : pos + TEXT_CONTEXT],
        config_text=b[pos : pos + TEXT_CONTEXT],
        unit="char",
    )


def _judge(base: PromptResult, cfg: PromptResult, lossless: bool) -> PromptVerdict:
    pid = base.prompt.prompt_id
    a, b = base.tokens, cfg.tokens
    if not (a and b) and base.samples and cfg.samples:
        return _judge_text(base, cfg, lossless)
    pos = first_divergence(a, b)
    if pos is None:
        return PromptVerdict(pid, IDENTICAL)
    tok_a = a[pos] if pos < len(a) else None  # None: that run stopped (end of text)
    tok_b = b[pos] if pos < len(b) else None
    probe = cfg.probe
    ref_probs = None
    if base.reference is not None and pos < len(base.reference.probs):
        ref_probs = base.reference.probs[pos]
    cfg_probs = probe.probs if probe is not None else None
    if tok_b is None and cfg_probs is not None:
        tok_b = cfg_probs.token  # what the config run chose instead of continuing
    if tok_a is None and ref_probs is not None:
        tok_a = ref_probs.token

    def pair(tp: Any) -> tuple[float | None, float | None]:
        if tp is None:
            return (None, None)
        return (
            tp.prob(tok_a) if tok_a is not None else None,
            tp.prob(tok_b) if tok_b is not None else None,
        )

    bp, cp = pair(ref_probs), pair(cfg_probs)
    # How sure the baseline was: its token's probability over the config's token's.
    margin = bp[0] - bp[1] if bp[0] is not None and bp[1] is not None else None
    # How much that margin moves when the same position is computed another way (the
    # config server re-decoding the common prefix as one batch): the numerical noise here.
    noise = None
    if margin is not None and cp[0] is not None and cp[1] is not None:
        noise = abs(margin - (cp[0] - cp[1]))
    if not lossless:
        verdict = CHANGED
    elif margin is not None and margin <= max(NEAR_TIE_MARGIN, min(noise or 0.0, NEAR_TIE_CAP)):
        verdict = NEAR_TIE
    else:
        # A confident baseline, or the config's token is not among its top candidates.
        verdict = DIVERGED
    return PromptVerdict(
        prompt_id=pid,
        verdict=verdict,
        position=pos,
        baseline_token=tok_a,
        config_token=tok_b,
        baseline_probs=bp,
        config_probs=cp,
        margin=margin,
        noise=noise,
        baseline_text=probe.reference_text if probe else "",
        config_text=probe.config_text if probe else "",
    )


def _speedup(
    base: Measurement, cfg: Measurement
) -> tuple[float | None, tuple[float, float] | None]:
    b, c = base.tokens_per_s, cfg.tokens_per_s
    br, cr = base.tokens_per_s_range, cfg.tokens_per_s_range
    if not b or c is None or br is None or cr is None or br[0] <= 0:
        return None, None
    return c / b, (cr[0] / br[1], cr[1] / br[0])


def judge(baseline: Measurement, config: Measurement) -> Verification:
    """The verdict for `config` against `baseline`, measured on the same prompts."""
    speedup, spread = _speedup(baseline, config)
    if not baseline.ok:
        assert baseline.failure is not None
        reason = f"the baseline failed: {baseline.failure}"
        return Verification(baseline, config, (), "fail", reason, None, None)
    if not config.ok:
        assert config.failure is not None
        return Verification(baseline, config, (), "fail", str(config.failure), None, None)
    lossless = config.config.lossless
    by_id = {p.prompt.prompt_id: p for p in config.prompts}
    verdicts = tuple(_judge(p, by_id[p.prompt.prompt_id], lossless) for p in baseline.prompts)
    failed = _failure(config, verdicts)
    if failed is not None:
        return Verification(baseline, config, verdicts, "fail", failed, speedup, spread)
    parts = _agreement(config, verdicts)
    if speedup is not None:
        parts.append(f"{'slower than' if speedup < 1 else 'faster than'} baseline: {speedup:.2f}x")
    return Verification(baseline, config, verdicts, "pass", "; ".join(parts), speedup, spread)


def _failure(config: Measurement, verdicts: tuple[PromptVerdict, ...]) -> str | None:
    """Why `config` fails against its baseline: no speculation, text or tokens that differ
    where the baseline was sure; None when it passes."""
    cfg = config.config
    if cfg.speculative and config.draft_n == 0:
        return (
            f"speculation did not happen: {cfg.spec_type} drafted no tokens on any of "
            f"{len(verdicts)} prompts (draft_n = 0)"
        )
    text_diverged = [v for v in verdicts if v.verdict == TEXT_DIVERGED]
    if text_diverged:
        v = text_diverged[0]
        if v.baseline_probs[1] is not None:
            why = (
                f"the baseline preferred its token by {_p(v.margin)} (p={_p(v.baseline_probs[0])} "
                f"vs {_p(v.baseline_probs[1])}): not a near-tie"
            )
        elif v.baseline_probs[0] is not None:
            why = (
                f"the baseline was sure there (p={_p(v.baseline_probs[0])}) and none of its top "
                f"candidates spells the {config.engine} text"
            )
        else:
            why = "the baseline's top candidates there are unknown, so it is not explained"
        return (
            f"output text differs from the baseline: prompt {v.prompt_id} char {v.position} "
            f"(baseline {v.baseline_text!r}, config {v.config_text!r}); {why}"
        )
    diverged = [v for v in verdicts if v.verdict == DIVERGED]
    if diverged:
        v = diverged[0]
        return (
            f"output differs from the baseline at a confident position: prompt {v.prompt_id} "
            f"token {v.position} (baseline p={_p(v.baseline_probs[0])} vs "
            f"config token p={_p(v.baseline_probs[1])}, numerical noise {_p(v.noise)})"
        )
    return None


def _agreement(config: Measurement, verdicts: tuple[PromptVerdict, ...]) -> list[str]:
    """How a passing `config`'s output agrees with its baseline's, in words."""
    n = len(verdicts)
    ties = [v for v in verdicts if v.verdict == NEAR_TIE]
    worst = max((v.margin or 0.0 for v in ties), default=0.0)
    same_text = sum(v.verdict == TEXT_IDENTICAL for v in verdicts)
    if not config.config.lossless:
        changed = [v for v in verdicts if v.verdict == CHANGED]
        first = min((v.position or 0) for v in changed) if changed else None
        return [
            f"behaviour-changing ({config.config.label}): differs from the full baseline on "
            f"{len(changed)}/{n} prompts"
            + (f", first at {changed[0].unit} {first}" if changed else "")
        ]
    if same_text or config.engine != ENGINE_SERVER:
        parts = [
            f"identical text on {same_text}/{n} prompts over the common length ({config.engine} "
            "prints text, not tokens)"
        ]
        if ties:
            parts.append(
                f"{len(ties)} equivalent up to numerics (the baseline's near-tied candidate "
                f"spells the {config.engine} text, margin <= {worst:.3f})"
            )
        return parts
    parts = [f"identical tokens on {sum(v.verdict == IDENTICAL for v in verdicts)}/{n} prompts"]
    if ties:
        parts.append(f"{len(ties)} equivalent up to numerics (near-tie, margin <= {worst:.3f})")
    return parts


def _p(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"
