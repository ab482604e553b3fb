"""Draft agreement, measured in seconds before any speculative run.

Teacher-forced agreement: the target generates greedy continuations of the shipped task
prompts (once per model, prompts and build; cached), and each draft reads the same tokens.
Where the draft's top token equals the target's is where greedy speculation accepts a drafted
token, so "same top" is the per-token acceptance of draft-simple at temperature 0.

* Temperature 0, scored on the answers (the default): the draft's guess at every answer token
  on llama-server, after the prompt alone, as in a run (`quality.drafting`). The guesses are
  kept, and the recommender replays drafting on them at any K.
* Otherwise the target's logits over the text are saved (cached) and the draft's compared:
* Same vocabulary, temperature 0: `llama-perplexity --kl-divergence` against the target's
  saved logits prints same-top and the KL divergence itself.
* Vocabulary sizes that differ (llama.cpp speculates with such pairs), or a temperature above
  0: the draft's logits are saved too and both files compared in numpy over the shared ids
  (`runner.logits.compare`). llama-perplexity is never given such a pair, because it only
  logs "inconsistent vocabulary" and prints numbers that mean nothing. At a temperature the
  acceptance is the target's probability of the draft's top token: llama-server drafts the
  draft's top token and accepts it when the target samples the same one.

Every (draft, task) measurement is recorded in the registry, failed ones included.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import duckdb

from specreg.errors import UsageError, param
from specreg.home import cache_dir
from specreg.host.load import measurement_lock, untimed
from specreg.jsonout import document
from specreg.llama.config import Config
from specreg.llama.logits import Answer, Comparison, compare, read_header, scored_per_chunk
from specreg.llama.perplexity import (
    MIN_TOKENS_FOR_STATISTICS,
    Perplexity,
    PerplexityFailed,
    build_id,
    human_size,
    logits_key,
    planned_size,
)
from specreg.llama.process import ServerFailed
from specreg.quality.drafting import DRAFT_CTX, draft_traces, summary
from specreg.quality.kld import Measuring, TextSource, record_failure, record_kld
from specreg.registry.quality_store import (
    METHOD_DRAFTED,
    METHOD_KLD,
    METHOD_SAVED,
    PURPOSE_AGREEMENT,
    TEXT_GENERATED,
    QualityRecord,
    record_quality,
)
from specreg.registry.queries import ModelRecord
from specreg.registry.scan import model_record
from specreg.runner.measure import measure
from specreg.runner.settings import Settings
from specreg.runner.workload import TASKS, Workload, task_prompts
from specreg.terms import ENGINE_SERVER, SPEC_DRAFT_SIMPLE

log = logging.getLogger(__name__)

# Tokens the target generates per prompt: 3 prompts give about 4 chunks of 128 tokens.
AGREE_N_PREDICT = 160
MIN_CTX = 16
# What agreement is scored on. Speculation only ever drafts answer tokens, and a prompt that
# supplies a text to summarise or edit is mostly new text neither model predicts, so the
# answers' tokens are what acceptance follows; the whole text (prompt and answer, as
# llama-perplexity scores it) is kept beside for comparison, and is the fallback.
SCORED_ANSWERS = "answers"
SCORED_TEXT = "text"
# Fewer answer rows than this in the scored chunks: the whole text is scored instead.
MIN_ANSWER_ROWS = 24
# How the prompts and answers are laid out in the text the models are scored on.
# joined: one after another (what llama-perplexity scores as prose; `--scored text`).
# chunked: each prompt and its answer alone in one chunk, at its end: llama-perplexity scores
# the second half of every chunk with nothing before the chunk in context, so the answer is
# scored with its whole prompt in view (a summary with the text it summarises) and none of
# the answer falls in an unscored first half. Filler words lead each chunk up to its prompt.
# How the draft's guesses are taken: auto is on llama-server where it can be (temperature 0,
# scored on the answers), else from saved logits.
VIA_AUTO = "auto"
VIA_SERVER = "server"
VIA_LOGITS = "logits"
VIAS = (VIA_AUTO, VIA_SERVER, VIA_LOGITS)
LAYOUT_JOINED = "joined"
LAYOUT_CHUNKED = "chunked"
FILLER = " the"  # one token in every tokenizer we ship for; never scored
CHUNK_MARGIN = 16  # tokens kept free at a chunk's end: re-tokenized seams move a part a little


@dataclass(frozen=True)
class GeneratedText:
    text: TextSource
    n_tokens: int  # prompt and generated tokens, as llama-server counted them
    cached: bool
    answers: tuple[Answer, ...] = ()  # the generated parts, by token ids and rough place
    layout: str = LAYOUT_JOINED
    ctx: int | None = None  # the chunk length a chunked layout was made for
    spans: tuple[tuple[int, int], ...] = ()  # a chunked layout's prompt-and-answer tokens
    prompts: tuple[str, ...] = ()  # the prompt of each answer


@dataclass(frozen=True)
class _Part:
    prompt: str
    answer: str
    prompt_n: int
    answer_n: int  # as the server counted its generated tokens
    answer_ids: tuple[int, ...]


def _chunk_len(parts: Sequence[_Part], min_ctx: int) -> int:
    """The shortest power-of-two chunk that holds every part with room to spare and scores
    every answer token (the scored rows are the chunk's second half), with room to spare
    there too: the answer may start a few tokens early."""
    need = max(
        max(p.prompt_n + p.answer_n + 2 * CHUNK_MARGIN, 2 * p.answer_n + 3 * CHUNK_MARGIN + 2)
        for p in parts
    )
    c = max(min_ctx, MIN_CTX)
    while c < need:
        c *= 2
    return c


def chunked_layout(
    parts: Sequence[_Part], min_ctx: int
) -> tuple[str, int, tuple[Answer, ...], tuple[tuple[int, int], ...]]:
    """(text, chunk length, answers, spans): part i ends CHUNK_MARGIN tokens before the end of
    chunk i, led up to by filler. Token places are the server's counts (a BOS first), good to
    a few tokens; `answer_positions` finds each answer exactly by its ids."""
    c = _chunk_len(parts, min_ctx)
    text, pos = "", 1
    answers, spans = [], []
    for i, p in enumerate(parts):
        length = p.prompt_n + p.answer_n
        fill = max((i + 1) * c - CHUNK_MARGIN - length - 1 - pos, 0)
        text += FILLER * fill + "\n\n" + p.prompt + p.answer
        start = pos + fill + 1
        answers.append(Answer(start + p.prompt_n, p.answer_ids))
        spans.append((start, start + length))
        pos = start + length
    text += FILLER * (2 * CHUNK_MARGIN)  # the last chunk must be whole to be scored
    return text, c, tuple(answers), tuple(spans)


def _text_key(target: ModelRecord, path: Path, task: str, n_predict: int, build: str) -> str:
    st = path.stat()
    prompts = [(p.prompt_id, p.text) for p in task_prompts(task)]
    raw = json.dumps(
        [os.fspath(path), st.st_size, st.st_mtime_ns, target.model_id, prompts, n_predict, build]
    )
    return hashlib.sha256(raw.encode()).hexdigest()[:20]


def target_text(
    m: Measuring,
    target: ModelRecord,
    target_path: Path,
    task: str,
    n_predict: int,
    layout: str = LAYOUT_JOINED,
) -> GeneratedText:
    """The target's own greedy continuations of the shipped `task` prompts, generated once per
    model, prompts and build, laid out as `layout` says. Raises the server's failure (a
    `LlamaError`) if it cannot run."""
    build = build_id(m.install)
    # a chunked layout depends on the smallest chunk asked for; the joined one on nothing more
    made_by = build if layout == LAYOUT_JOINED else f"{build}/{layout}/{m.ctx}"
    key = _text_key(target, target_path, task, n_predict, made_by)
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", target_path.stem)[:60]
    folder = m.logits_cache().root / "texts"  # beside the logits saved over them
    suffix = "" if layout == LAYOUT_JOINED else f".{layout}"
    path = folder / f"{stem}.{task}.n{n_predict}{suffix}.{key}.txt"
    meta = path.with_suffix(".json")
    name = f"agree-{task}"
    known = json.loads(meta.read_text()) if path.exists() and meta.exists() else {}
    if "prompts" in known:  # (texts cached before prompts were kept are generated again)
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        answers = tuple(Answer(int(a["start"]), tuple(a["ids"])) for a in known["answers"])
        source = TextSource(name, task, path, sha, TEXT_GENERATED)
        kept_spans = tuple((int(a), int(b)) for a, b in known.get("spans", ()))
        return GeneratedText(
            source, int(known["n_tokens"]), True, answers, layout, known.get("ctx"), kept_spans,
            tuple(str(x) for x in known["prompts"]),
        )  # fmt: skip
    m.say(f"generating {target_path.name}'s greedy text for {task} ({n_predict} tokens a prompt)")
    workload = Workload(f"task:{task}", task_prompts(task))
    # Untimed: it takes its turn on the host (measure's lock) but a busy host changes no token
    with untimed():
        got = measure(
            m.install, m.host, Config(threads=m.threads), target_path, None, workload,
            Settings(n_predict=n_predict, repeats=1, retries=0, warmup=False, engine=ENGINE_SERVER),
        )  # fmt: skip
    if got.failure is not None:
        raise got.failure
    parts = [
        _Part(p.prompt.text, s.content, s.prompt_n, s.predicted_n, tuple(s.tokens))
        for p in got.prompts
        if p.samples
        for s in p.samples[:1]
    ]
    ctx: int | None = None
    spans: tuple[tuple[int, int], ...] = ()
    if layout == LAYOUT_CHUNKED:
        text, ctx, answers, spans = chunked_layout(parts, m.ctx)
        n_tokens = spans[-1][1] + 2 * CHUNK_MARGIN if spans else 0
    else:
        # Where each answer starts among the joined text's tokens, by the server's counts (the
        # two-newline seam about one token); `answer_positions` finds the exact place by ids.
        found: list[Answer] = []
        at = 0
        for part in parts:
            found.append(Answer(at + part.prompt_n, part.answer_ids))
            at += part.prompt_n + part.answer_n + 1
        answers = tuple(found)
        text = "\n\n".join(part.prompt + part.answer for part in parts)
        n_tokens = sum(part.prompt_n + part.answer_n for part in parts)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob(f"{stem}.{task}.n{n_predict}{suffix}.*"):
        with contextlib.suppress(OSError):
            old.unlink()  # generated by an earlier model file or build
    path.write_text(text)
    kept = [{"start": a.start, "ids": list(a.ids)} for a in answers]
    meta.write_text(
        json.dumps({
            "n_tokens": n_tokens, "target": os.fspath(target_path), "answers": kept,
            "layout": layout, "ctx": ctx, "spans": [list(s) for s in spans],
            "prompts": [part.prompt for part in parts],
        }) + "\n"
    )  # fmt: skip
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    source = TextSource(name, task, path, sha, TEXT_GENERATED)
    prompts = tuple(part.prompt for part in parts)
    return GeneratedText(source, n_tokens, False, answers, layout, ctx, spans, prompts)


def fit_ctx(n_tokens: int, ctx: int) -> int:
    """The chunk length that still scores enough tokens of a text this long: llama-perplexity
    needs two chunks, and prints its statistics from 100 scored tokens on."""
    usable = int(n_tokens * 0.9)  # re-tokenizing the joined text may merge a few tokens
    c = ctx
    while c > MIN_CTX and (
        usable // c < 2 or (usable // c) * scored_per_chunk(c) < MIN_TOKENS_FOR_STATISTICS
    ):
        c //= 2
    return c


@dataclass(frozen=True)
class AgreementPoint:
    """One draft on one task's text. Shares are 0..1; None when the measurement failed."""

    draft_id: str
    draft_name: str
    draft_path: str
    task: str
    measurement_id: int
    method: str
    n_tokens: int | None
    same_top: float | None
    same_top_unc: float | None
    mean_kld: float | None
    mean_kld_unc: float | None
    accept: float | None  # per-token acceptance at `temperature` (same_top when greedy)
    n_vocab_target: int | None
    n_vocab_draft: int | None
    seconds: float
    error: str | None = None
    confidence: dict[float, tuple[float, float]] | None = None
    scored: str = SCORED_TEXT  # answers | text: the positions the shares are over
    text_same_top: float | None = None  # same top token over the whole text, for comparison

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class AgreementResult:
    JSON_KIND: ClassVar[str] = "agreement"
    JSON_VERSION: ClassVar[str] = "1"

    target: str
    target_id: str
    temperature: float
    build: str
    texts: tuple[GeneratedText, ...]
    points: tuple[AgreementPoint, ...]

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.points)

    @property
    def acceptance_label(self) -> str:
        if self.temperature > 0:
            return (
                f"target's probability of the draft's top token at temperature {self.temperature:g}"
            )
        return "greedy (same top token)"

    def to_json(self) -> dict[str, Any]:
        return document(
            self.JSON_KIND,
            self.JSON_VERSION,
            {
                "target": self.target,
                "target_id": self.target_id,
                "temperature": self.temperature,
                "acceptance": self.acceptance_label,
                "llama_build": self.build,
                "texts": [
                    {
                        "task": t.text.task,
                        "path": t.text.path,
                        "sha256": t.text.sha256,
                        "n_tokens": t.n_tokens,
                        "cached": t.cached,
                        "layout": t.layout,
                        "ctx": t.ctx,
                    }
                    for t in self.texts
                ],
                "points": [
                    {
                        **{k: v for k, v in p.__dict__.items() if k != "confidence"},
                        "confidence": None
                        if p.confidence is None
                        else {f"{k:g}": list(v) for k, v in p.confidence.items()},
                    }
                    for p in self.points
                ],
            },
        )


def agreement_drafts(
    con: duckdb.DuckDBPyConnection, target: ModelRecord, drafts: Sequence[Path]
) -> list[ModelRecord]:
    """The drafts to measure: the ones given (each must be able to draft for the target), or
    every compatible draft model in the registry."""
    import specreg.auditor as auditor

    if drafts:
        out = []
        for path in drafts:
            d = model_record(con, path)
            if d.model_id == target.model_id:
                raise UsageError(f"{Path(path).name} is the target itself: give another draft")
            pv = auditor.check_pair(con, target, d)
            if not pv.compatible or pv.spec_type != SPEC_DRAFT_SIMPLE:
                why = "; ".join(pv.reasons) or f"it drafts as {pv.spec_type}"
                raise UsageError(
                    f"{Path(path).name} cannot draft for {Path(target.path).name} ({why}): "
                    "`specreg compat TARGET DRAFT` explains"
                )
            out.append(d)
        return out
    found = auditor.compatible_drafts(con, target)
    return [
        model_record(con, Path(pv.draft.path)) for pv in found if pv.spec_type == SPEC_DRAFT_SIMPLE
    ]


def _saved_comparison(
    m: Measuring,
    tool: Perplexity,
    draft: ModelRecord,
    text: TextSource,
    base: Path,
    temperature: float,
    answers: tuple[Answer, ...] = (),
    spans: tuple[tuple[int, int], ...] = (),
) -> tuple[Comparison, Comparison | None, tuple[str, ...]]:
    """Save the draft's logits over the text to a temporary file and compare it with the
    target's saved logits, over the ids both vocabularies have: over the whole text (within
    `spans` where they are given: a chunked layout's filler is no text), and over the
    answers' tokens when they are known (else None)."""
    header = read_header(base)
    chunks = header.n_chunk
    size = planned_size(draft.n_tokens or 0, text.path, header.n_ctx, chunks)
    if size > m.max_logits_bytes:
        raise UsageError(
            f"the saved logits of {Path(draft.path).name} would take about {human_size(size)}, "
            f"over the {human_size(m.max_logits_bytes)} limit: pass {param('chunks', 'N')} or "
            f"raise {param('max_logits_gb')}"
        )
    m.say(f"saving {Path(draft.path).name}'s logits over {text.name}: about {human_size(size)}")
    tmp_dir = cache_dir() / "tmp"
    tmp = tmp_dir / f"draft-{os.getpid()}-{time.monotonic_ns()}.kld"
    try:
        with measurement_lock(f"{Path(draft.path).name}'s logits on {text.name}"):
            saved = tool.save_logits(
                Path(draft.path), text.path, tmp, ctx=header.n_ctx, chunks=chunks
            )
        whole = compare(base, saved.path, temperature, spans=spans or None)
        on_answers = compare(base, saved.path, temperature, answers) if answers else None
        return whole, on_answers, saved.argv
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


@dataclass(frozen=True)
class AgreementPlan:
    """A checked agreement request: the target and its drafts by registry record."""

    target: ModelRecord
    target_path: Path
    drafts: tuple[ModelRecord, ...]
    tasks: tuple[str, ...]
    temperature: float


def plan_agreement(
    con: duckdb.DuckDBPyConnection,
    target: Path,
    drafts: Sequence[Path] = (),
    tasks: Sequence[str] = (),
    *,
    temperature: float = 0.0,
) -> AgreementPlan:
    """Check a request; a bad one raises `UsageError` with one line that says what to do."""
    if temperature < 0:
        raise UsageError(f"{param('temperature')} must be >= 0, got {temperature}")
    for task in tasks:
        if task not in TASKS:
            raise UsageError(f"unknown task {task!r}: use one of {', '.join(TASKS)}")
    t = model_record(con, target)
    target_path = Path(target).resolve()
    chosen = agreement_drafts(con, t, drafts)
    if not chosen:
        raise UsageError(
            f"no draft to measure: the registry has no compatible draft model for "
            f"{target_path.name} (scan one, or pass DRAFT paths)"
        )
    return AgreementPlan(t, target_path, tuple(chosen), tuple(tasks) or TASKS, temperature)


def measure_agreement(
    con: duckdb.DuckDBPyConnection,
    m: Measuring,
    plan: AgreementPlan,
    *,
    n_predict: int = AGREE_N_PREDICT,
    scored: str = SCORED_ANSWERS,
    via: str = VIA_AUTO,
) -> AgreementResult:
    """Agreement of each planned draft with the target on each task's target-generated text,
    recorded. llama.cpp failures per draft are recorded and returned; a target that cannot
    generate its text raises. `scored`: answers (the generated tokens only, what speculation
    drafts; the whole text where too few answer tokens fall in the scored chunks) or text.
    `via`: where the draft's guesses come from (VIAS); server needs temperature 0 and answers."""
    on_server = via == VIA_SERVER or (
        via == VIA_AUTO and plan.temperature == 0 and scored == SCORED_ANSWERS
    )
    if on_server and (plan.temperature > 0 or scored != SCORED_ANSWERS):
        raise UsageError(
            f"{param('via')} server takes the draft's greedy guesses at the answers' tokens: "
            f"use it at {param('temperature')} 0 with {param('scored')} answers, or "
            f"{param('via')} logits"
        )
    t, target_path = plan.target, plan.target_path
    tool = m.tool()
    cache = m.logits_cache()
    texts: list[GeneratedText] = []
    points: list[AgreementPoint] = []
    for task in plan.tasks:
        layout = LAYOUT_CHUNKED if scored == SCORED_ANSWERS else LAYOUT_JOINED
        gen = target_text(m, t, target_path, task, n_predict, layout)
        texts.append(gen)
        if on_server:  # the target's answers are all the draft needs
            points.extend(_one_draft_on_server(con, m, tool, _Pairing(t, target_path, d, gen))
                          for d in plan.drafts)  # fmt: skip
            continue
        ctx = gen.ctx or fit_ctx(gen.n_tokens, m.ctx)
        key = logits_key(
            target_path, t.model_id, gen.text.name, gen.text.sha256, tool.build, ctx, m.chunks
        )
        with measurement_lock(f"{target_path.name}'s logits on {gen.text.name}"):
            base = cache.ensure(
                tool, key, gen.text.path, t.n_tokens or 0, max_bytes=m.max_logits_bytes,
                notify=m.notify,
            )  # fmt: skip
        scoring = _Scoring(base.path, ctx, plan.temperature, scored)
        points.extend(
            _one_draft(con, m, tool, _Pairing(t, target_path, d, gen), scoring) for d in plan.drafts
        )
    return AgreementResult(
        target=os.fspath(target_path),
        target_id=t.model_id,
        temperature=plan.temperature,
        build=tool.build,
        texts=tuple(texts),
        points=tuple(points),
    )


@dataclass(frozen=True)
class _Pairing:
    """One draft against the target on one of the target's texts."""

    target: ModelRecord
    target_path: Path
    draft: ModelRecord
    gen: GeneratedText

    @property
    def draft_name(self) -> str:
        return Path(self.draft.path).name

    def record_fields(self) -> dict[str, Any]:
        """The columns of a quality record that say which pair it compared on which text."""
        return {
            "base_model_id": self.target.model_id,
            "base_path": os.fspath(self.target_path),
            "model_id": self.draft.model_id,
            "model_path": self.draft.path,
            "n_vocab_base": self.target.n_tokens,
            "n_vocab_model": self.draft.n_tokens,
            **self.gen.text.record_fields(),
        }


@dataclass(frozen=True)
class _Scoring:
    """How a draft's logits are scored: against the target's saved logits (`base`) at `ctx`,
    at `temperature`, over the answers or the whole text (`scored_on`)."""

    base: Path
    ctx: int
    temperature: float
    scored_on: str = SCORED_ANSWERS


def _one_draft(
    con: duckdb.DuckDBPyConnection, m: Measuring, tool: Perplexity, pair: _Pairing, how: _Scoring
) -> AgreementPoint:
    """One draft's agreement on one text. Scored on answers (and they are known): over their
    tokens, the draft's logits saved and compared per position; else over the whole text
    (a chunked layout's prompts and answers, never its filler), by llama-perplexity itself
    where it can."""
    t, d, gen, text = pair.target, pair.draft, pair.gen, pair.gen.text
    answers = gen.answers if how.scored_on == SCORED_ANSWERS else ()
    same_vocab = (t.n_tokens or 0) == (d.n_tokens or 0)
    kld = same_vocab and how.temperature == 0 and not answers
    method = METHOD_KLD if kld else METHOD_SAVED
    t0 = time.monotonic()
    rec = m.base_record(
        tool,
        PURPOSE_AGREEMENT,
        config={
            "ctx": how.ctx,
            "chunks": m.chunks,
            "threads": tool.threads,
            "temperature": how.temperature,
        },
        **pair.record_fields(),
        ctx=how.ctx,
        n_chunks=m.chunks,
        method=method,
        temperature=how.temperature,
    )
    point = _point_maker(pair, method, t0)
    m.say(f"agreement of {pair.draft_name} with {pair.target_path.name} on {text.name} ({method})")
    try:
        if kld:
            with measurement_lock(f"agreement of {pair.draft_name} on {text.name}"):
                run = tool.kl_divergence(Path(d.path), text.path, how.base)
            s = run.stats
            mid, _ = record_kld(con, rec, t0, run, accept=s.same_top)
            return point(
                mid, n_tokens=run.n_tokens, same_top=s.same_top, same_top_unc=s.same_top_unc,
                mean_kld=s.mean_kld, mean_kld_unc=s.mean_kld_unc, accept=s.same_top,
                text_same_top=s.same_top,
            )  # fmt: skip
        whole, on_answers, argv = _saved_comparison(
            m, tool, d, text, how.base, how.temperature, answers, gen.spans
        )
    except (PerplexityFailed, UsageError) as err:
        return point(record_failure(con, rec, t0, err)[0], error=str(err))
    return _saved_point(con, rec, t0, (whole, on_answers, argv), point)


def _point_maker(pair: _Pairing, method: str, t0: float) -> Callable[..., AgreementPoint]:
    """The agreement point of `pair` by `method` begun at `t0`, from its measurement id and
    what was measured (nothing measured by default)."""

    def point(mid: int, **kw: Any) -> AgreementPoint:
        d = pair.draft
        fields: dict[str, Any] = dict(
            draft_id=d.model_id, draft_name=pair.draft_name, draft_path=d.path,
            task=pair.gen.text.task or "", measurement_id=mid, method=method, n_tokens=None,
            same_top=None, same_top_unc=None, mean_kld=None, mean_kld_unc=None, accept=None,
            n_vocab_target=pair.target.n_tokens, n_vocab_draft=d.n_tokens,
            seconds=time.monotonic() - t0,
        )  # fmt: skip
        fields.update(kw)
        return AgreementPoint(**fields)

    return point


def _saved_point(
    con: duckdb.DuckDBPyConnection,
    rec: QualityRecord,
    t0: float,
    compared: tuple[Comparison, Comparison | None, tuple[str, ...]],
    point: Callable[..., AgreementPoint],
) -> AgreementPoint:
    """Record the comparison of saved logits (`_saved_comparison`: over the whole text, over
    the answers, the argv): on the answers where enough of their tokens were scored."""
    whole, on_answers, argv = compared
    use_answers = on_answers is not None and on_answers.n_tokens >= MIN_ANSWER_ROWS
    c = on_answers if use_answers and on_answers is not None else whole
    scored = SCORED_ANSWERS if use_answers else SCORED_TEXT
    pct = c.kld_percentiles
    mid = record_quality(
        con,
        replace(
            rec, status="ok", seconds=time.monotonic() - t0, n_tokens=c.n_tokens, argv=argv,
            config={**rec.config, "scored": scored, "text_same_top": whole.same_top,
                    "text_n_tokens": whole.n_tokens,
                    "traces": [t.to_json() for t in c.traces]},
            n_vocab_base=c.n_vocab_base, n_vocab_model=c.n_vocab_other,
            mean_kld=c.mean_kld, mean_kld_unc=c.mean_kld_unc, kld_median=pct.get("median"),
            kld_p90=pct.get("p90"), kld_p95=pct.get("p95"), kld_p99=pct.get("p99"),
            kld_p999=pct.get("p999"), kld_max=pct.get("max"), same_top=c.same_top,
            same_top_unc=c.same_top_unc, ppl=c.ppl_other, ppl_base=c.ppl_base,
            ln_ppl_ratio=_ln_ratio(c), accept=c.accept, confidence=c.confidence,
        ),
    )  # fmt: skip
    return point(
        mid, n_tokens=c.n_tokens, same_top=c.same_top, same_top_unc=c.same_top_unc,
        mean_kld=c.mean_kld, mean_kld_unc=c.mean_kld_unc, accept=c.accept,
        n_vocab_target=c.n_vocab_base, n_vocab_draft=c.n_vocab_other, confidence=c.confidence,
        scored=scored, text_same_top=whole.same_top,
    )  # fmt: skip


def _one_draft_on_server(
    con: duckdb.DuckDBPyConnection, m: Measuring, tool: Perplexity, pair: _Pairing
) -> AgreementPoint:
    """One draft's greedy guesses at every answer token of one text, on llama-server
    (`quality.drafting`), recorded with the guesses themselves."""
    t, target_path, d, gen = pair.target, pair.target_path, pair.draft, pair.gen
    text, name = gen.text, pair.draft_name
    t0 = time.monotonic()
    log_path = tool.log_path.with_name(f"agree-{os.getpid()}-{time.monotonic_ns()}.log")
    rec = m.base_record(
        tool, PURPOSE_AGREEMENT,
        config={"threads": m.threads, "temperature": 0.0, "ctx": DRAFT_CTX},
        **pair.record_fields(), ctx=DRAFT_CTX, method=METHOD_DRAFTED, temperature=0.0,
        log_path=os.fspath(log_path),
    )  # fmt: skip
    m.say(f"agreement of {name} with {target_path.name} on {text.name} ({METHOD_DRAFTED})")
    common: dict[str, Any] = dict(
        draft_id=d.model_id, draft_name=name, draft_path=d.path, task=text.task or "",
        method=METHOD_DRAFTED, mean_kld=None, mean_kld_unc=None, n_vocab_target=t.n_tokens,
        n_vocab_draft=d.n_tokens, scored=SCORED_ANSWERS,
    )  # fmt: skip
    try:
        if len(gen.prompts) != len(gen.answers):
            raise UsageError(f"{text.name} has no prompts kept: delete it from the cache")
        with measurement_lock(f"agreement of {name} on {text.name}"):
            traces, prompt_ids = draft_traces(m, Path(d.path), gen.prompts, gen.answers, log_path)
    except (ServerFailed, UsageError) as err:
        mid, seconds = record_failure(con, rec, t0, err)
        return AgreementPoint(
            **common, measurement_id=mid, n_tokens=None, same_top=None, same_top_unc=None,
            accept=None, seconds=seconds, error=str(err),
        )  # fmt: skip
    n, share, unc, conf = summary(traces)
    seconds = time.monotonic() - t0
    mid = record_quality(
        con,
        replace(
            rec, status="ok", seconds=seconds, n_tokens=n, same_top=share, same_top_unc=unc,
            accept=share, confidence=conf,
            config={**rec.config, "scored": SCORED_ANSWERS,
                    "traces": [x.to_json() for x in traces],
                    # the target's text as token ids: ngram-mod is replayed on it
                    "prompt_ids": [list(x) for x in prompt_ids],
                    "answer_ids": [list(a.ids) for a in gen.answers]},
        ),
    )  # fmt: skip
    return AgreementPoint(
        **common, measurement_id=mid, n_tokens=n, same_top=share, same_top_unc=unc,
        accept=share, seconds=seconds, confidence=conf,
    )  # fmt: skip


def _ln_ratio(c: Comparison) -> float | None:
    if c.ppl_base > 0 and c.ppl_other > 0:
        return math.log(c.ppl_other / c.ppl_base)
    return None
