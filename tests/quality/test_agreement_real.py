"""`specreg agree` with the pinned llama.cpp on real small models: SmolLM2-135M's own greedy
text, its Q8_0 and Q4_0 self-drafts, the random-weight synthetic MoE; the draft's guesses on
llama-server replaying a real speculative run's acceptance; a draft whose
vocabulary is 64 ids larger than its target's (compared over the shared ids, never handed
to `llama-perplexity --kl-divergence`); acceptance at a temperature from saved logits."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.constants import TokenType

from specreg.cli.main import cli
from specreg.errors import UsageError
from specreg.host.machine import detect_host
from specreg.llama.config import Config
from specreg.llama.install import LlamaInstall
from specreg.llama.logits import scored_per_chunk
from specreg.quality.agreement import (
    LAYOUT_CHUNKED,
    MIN_ANSWER_ROWS,
    SCORED_ANSWERS,
    SCORED_TEXT,
    VIA_LOGITS,
    VIA_SERVER,
    measure_agreement,
    plan_agreement,
)
from specreg.quality.kld import Measuring
from specreg.recommender.acceptance import load_agreement, replay
from specreg.registry.quality_store import (
    METHOD_DRAFTED,
    METHOD_KLD,
    METHOD_SAVED,
    PURPOSE_AGREEMENT,
    TEXT_GENERATED,
    list_quality,
)
from specreg.registry.scan import model_record
from specreg.runner.measure import measure
from specreg.runner.settings import Settings
from specreg.runner.workload import Workload, task_prompts
from specreg.samples.small_models import SmallModels
from specreg.samples.synthetic import SyntheticModels

from support.quality import CHUNKS
from support.schemas import validate

pytestmark = pytest.mark.llama

N_PAD = 64


def padded_copy(src: Path, out: Path, n_pad: int = N_PAD) -> Path:
    """`src` with `n_pad` control tokens appended to its vocabulary and zero rows appended
    to its embedding and output head: the same model on the shared ids, as Qwen2.5's 0.5B
    draft is to its 32B target (151,936 ids against 152,064)."""
    reader = GGUFReader(src)
    arch = str(reader.fields["general.architecture"].contents())
    w = GGUFWriter(out, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = field.contents()
        vtype = field.types[0]
        sub = field.types[1] if vtype == GGUFValueType.ARRAY else None
        if name == "tokenizer.ggml.tokens":
            value = [*value, *(f"<|pad_{i}|>" for i in range(n_pad))]
        elif name == "tokenizer.ggml.token_type":
            value = [*value, *([int(TokenType.CONTROL)] * n_pad)]
        elif name == "tokenizer.ggml.scores":
            value = [*value, *([0.0] * n_pad)]
        w.add_key_value(name, value, vtype, sub_type=sub)
    for t in reader.tensors:
        data = np.array(t.data).reshape([int(x) for x in reversed(t.shape.tolist())])
        if t.name in ("token_embd.weight", "output.weight"):
            data = np.concatenate([data, np.zeros((n_pad, data.shape[1]), dtype=data.dtype)])
        w.add_tensor(t.name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def test_agreement_orders_the_self_drafts_and_the_random_draft(
    con, measuring: Measuring, small_models: SmallModels, synthetic_models: SyntheticModels
) -> None:
    target = small_models.smollm2.path
    q8 = small_models.draft("smollm2", "Q8_0").path
    q4 = small_models.draft("smollm2", "Q4_0").path
    rand = synthetic_models.moe.path
    plan = plan_agreement(con, target, (q8, q4, rand), ("code",))
    result = measure_agreement(con, measuring, plan, via=VIA_LOGITS)
    by = {Path(p.draft_path).name: p for p in result.points}
    # from saved logits, over the answers' tokens only (what speculation drafts): the draft's
    # logits are saved and compared per position, the whole text's share kept beside
    assert all(p.ok and p.method == METHOD_SAVED for p in result.points), result.points
    assert all(p.scored == SCORED_ANSWERS for p in result.points), result.points
    s8, s4, sr = (by[p.name].same_top for p in (q8, q4, rand))
    assert s8 is not None and s4 is not None and sr is not None
    assert s8 > s4 > 0.4 and s8 > 0.85 and sr < 0.05
    assert by[q8.name].mean_kld < by[q4.name].mean_kld < by[rand.name].mean_kld  # type: ignore[operator]
    # each prompt and its answer alone in a chunk, the answer in the scored half: nearly
    # every answer token is scored (the first of each is left out: it may merge at the seam)
    (text,) = result.texts
    assert text.layout == LAYOUT_CHUNKED and text.ctx is not None and text.ctx >= 128
    n = by[q8.name].n_tokens
    answer_ids = sum(len(a.ids) for a in text.answers[:CHUNKS])
    assert n is not None and MIN_ANSWER_ROWS <= answer_ids - 8 * CHUNKS <= n <= answer_ids
    assert n <= CHUNKS * scored_per_chunk(text.ctx)
    whole = by[q8.name].text_same_top
    assert whole is not None and abs(whole - s8) < 0.1
    assert not text.cached and text.text.source == TEXT_GENERATED and text.n_tokens >= 512

    rows = list_quality(con, purpose=PURPOSE_AGREEMENT)
    assert len(rows) == 3 and {r.model_path for r in rows} == {str(q8), str(q4), str(rand)}
    assert all(r.base_path == str(target) and r.task == "code" and r.ok for r in rows)
    assert all(r.accept == r.same_top and r.temperature == 0 for r in rows)

    again = measure_agreement(
        con, measuring, plan_agreement(con, target, (q8,), ("code",)), via=VIA_LOGITS
    )
    assert again.texts[0].cached and again.texts[0].text.sha256 == text.text.sha256
    assert again.points[0].same_top == pytest.approx(s8)


def test_the_drafts_guesses_on_the_server_replay_a_real_speculative_run(
    con,
    measuring: Measuring,
    llama_install: LlamaInstall,
    small_models: SmallModels,
    synthetic_models: SyntheticModels,
) -> None:
    """`agree`'s default: the draft's greedy guess at each of the target's answer tokens on
    llama-server, after the prompt alone. Drafting replayed on those guesses predicts what a
    real draft-simple run on the same prompts accepts per drafted token."""
    target = small_models.smollm2.path
    q8 = small_models.draft("smollm2", "Q8_0").path
    q4 = small_models.draft("smollm2", "Q4_0").path
    rand = synthetic_models.moe.path
    n_predict = 48
    plan = plan_agreement(con, target, (q8, q4, rand), ("code",))
    result = measure_agreement(con, measuring, plan, n_predict=n_predict)
    by = {Path(p.draft_path).name: p for p in result.points}
    assert all(p.ok and p.method == METHOD_DRAFTED for p in result.points), result.points
    assert all(p.scored == SCORED_ANSWERS and p.mean_kld is None for p in result.points)
    s8, s4, sr = (by[p.name].same_top for p in (q8, q4, rand))
    assert s8 is not None and s4 is not None and sr is not None
    assert s8 > s4 > 0.4 and s8 > 0.85 and sr < 0.05
    # every guess is kept: one trace per answer, as long as the answer
    (text,) = result.texts
    found = load_agreement(con, model_record(con, target).model_id, "code")
    traces = found[model_record(con, q4).model_id].traces
    assert [len(t.same) for t in traces] == [len(a.ids) for a in text.answers]
    assert len(text.prompts) == len(text.answers) == len(traces) > 0
    # a real draft-simple run on a fresh server, K=4, the same prompts and length
    run = measure(
        llama_install, detect_host(), Config(spec_type="draft-simple", k=4, threads=1),
        target, q4, Workload("task:code", task_prompts("code")),
        Settings(n_predict=n_predict, repeats=1, warmup=False, retries=0),
    )  # fmt: skip
    assert run.failure is None and run.draft_n > 0, run.failure
    accepted, drafted = replay(traces, 4)
    assert run.acceptance == pytest.approx(accepted / drafted, abs=0.08)
    # and the explicit way there, which refuses what it cannot measure
    with pytest.raises(UsageError, match="via. logits"):
        measure_agreement(con, measuring, plan, scored=SCORED_TEXT, via=VIA_SERVER)


def test_a_draft_with_more_ids_is_compared_over_the_shared_ones(
    con, measuring: Measuring, synthetic_models: SyntheticModels, tmp_path: Path
) -> None:
    target = synthetic_models.moe.path  # 49,152 ids
    padded = padded_copy(target, tmp_path / "synth-padded.gguf")  # 49,216 ids
    plan = plan_agreement(con, target, (padded,), ("prose",))
    (point,) = measure_agreement(con, measuring, plan, via=VIA_LOGITS).points
    assert point.ok, point.error
    assert point.method == METHOD_SAVED
    assert (point.n_vocab_target, point.n_vocab_draft) == (49152, 49152 + N_PAD)
    # The same weights on the shared ids: the same top token everywhere, next to no divergence.
    assert point.same_top == 1.0
    assert point.mean_kld is not None and point.mean_kld < 1e-3
    (row,) = list_quality(con, purpose=PURPOSE_AGREEMENT)
    assert row.method == METHOD_SAVED and row.n_vocab_model == 49152 + N_PAD
    assert "--kl-divergence" not in row.argv and "--kl-divergence-base" in row.argv
    # on llama-server the draft picks among all its ids, and still never a padded one
    (guessed,) = measure_agreement(con, measuring, plan).points
    assert guessed.method == METHOD_DRAFTED and guessed.same_top == 1.0


def test_temperature_acceptance_from_saved_logits_matches_the_tools_same_top(
    con, measuring: Measuring, small_models: SmallModels
) -> None:
    target = small_models.smollm2.path
    q4 = small_models.draft("smollm2", "Q4_0").path
    # over the whole text, where llama-perplexity's own statistics exist to check against
    plan = plan_agreement(con, target, (q4,), ("math",))
    greedy = measure_agreement(con, measuring, plan, scored=SCORED_TEXT)
    warm = measure_agreement(
        con, measuring, plan_agreement(con, target, (q4,), ("math",), temperature=0.7),
        scored=SCORED_TEXT,
    )  # fmt: skip
    g, w = greedy.points[0], warm.points[0]
    assert g.method == METHOD_KLD and w.method == METHOD_SAVED
    # Saved (quantized) draft logits against the tool's float ones: the same answer.
    assert w.same_top == pytest.approx(g.same_top, abs=0.02)
    assert w.mean_kld == pytest.approx(g.mean_kld, rel=0.05)
    assert w.accept is not None and 0.2 < w.accept < 1.0 and w.accept != w.same_top
    assert w.confidence is not None and w.confidence[0.0][0] == 1.0
    assert "temperature 0.7" in warm.acceptance_label


def test_the_command_reports_json(small_models: SmallModels, specreg_home: Path) -> None:
    target = str(small_models.smollm2.path)
    q8 = str(small_models.draft("smollm2", "Q8_0").path)
    args = ["agree", target, q8, "--task", "json", "--chunks", "2", "--threads", "1", "--json"]
    r = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert (doc["version"], doc["kind"], doc["temperature"]) == ("1", "agreement", 0.0)
    validate(doc)  # tests/schemas pins every field
    (point,) = doc["points"]
    assert point["task"] == "json" and point["method"] == METHOD_DRAFTED
    assert point["same_top"] > 0.8 and point["n_tokens"] > 0
    # the draft's guesses on llama-server: no logits saved, so no KL divergence or whole text
    assert point["scored"] == SCORED_ANSWERS and point["text_same_top"] is None
    assert point["mean_kld"] is None
    assert doc["acceptance"] == "greedy (same top token)"


def test_recommend_stops_ranking_the_random_draft_once_agreement_is_measured(
    con, measuring: Measuring, small_models: SmallModels, synthetic_models: SyntheticModels
) -> None:
    """The issue's case, before any speculative run: the prior guesses a high acceptance for
    the random-weight synthetic MoE as SmolLM2's draft; measured agreement says 0 %."""
    from specreg.host.facts import detect_host_facts
    from specreg.recommender.acceptance import ACC_AGREEMENT, ACC_PREDICTED
    from specreg.recommender.advisor import open_advisor
    from specreg.registry.scan import model_record
    from specreg.terms import Method

    target = small_models.smollm2.path
    rand = synthetic_models.moe_draft.path  # the synthetic MoE's small Q8_0
    for path in (target, rand):
        model_record(con, path)  # scanned, as `specreg scan` would
    facts = detect_host_facts(fingerprint=detect_host().fingerprint)
    advisor = open_advisor(con, facts)
    rand_id = model_record(con, rand).model_id

    def rank() -> tuple[list, object]:  # type: ignore[type-arg]
        rec = advisor.recommend(con, str(target), task="code")
        mine = [o for o in rec.options if o.method is Method.DRAFT and o.draft_id == rand_id]
        return mine, rec

    before, _ = rank()
    assert before and all(o.acceptance_source == ACC_PREDICTED for o in before)
    assert max(o.acceptance or 0 for o in before) > 0.3  # the prior's guess
    measure_agreement(con, measuring, plan_agreement(con, target, (rand,), ("code",)))
    after, rec = rank()
    plain = next(o for o in rec.options if o.method is Method.NONE and o.experts is None)
    assert after and all(o.acceptance_source == ACC_AGREEMENT for o in after)
    # 0 % measured (the cost model keeps a floor of 1e-4 a token so its logarithms stay finite)
    assert all((o.acceptance or 0.0) < 1e-3 and o.tps < plain.tps for o in after)
    assert rec.options.index(plain) < min(rec.options.index(o) for o in after)
    ruled_out = [a for a in rec.advice if a.startswith("measured agreement rules out")]
    assert ruled_out and "0% per token measured by `specreg agree`" in ruled_out[0]
    assert any("0% per token measured" in w for w in after[0].why)


def test_tune_measures_missing_agreement_once_before_any_run(
    con, llama_install, small_models: SmallModels
) -> None:
    from specreg.registry.scan import scan_paths
    from specreg.tune.tuner import agree_if_missing

    target = small_models.smollm2.path
    q4 = small_models.draft("smollm2", "Q4_0").path
    scan_paths(con, [target, q4])
    hook = agree_if_missing(con, target, llama_install, detect_host(), "json", threads=1)

    first = hook()
    rows = list_quality(con, purpose=PURPOSE_AGREEMENT)
    assert first is not None and {Path(p.draft_path).name for p in first.points} >= {q4.name}
    assert rows and all(r.task == "json" and r.ok for r in rows)
    assert hook() is None  # recorded agreement is reused: no second measurement
    assert len(list_quality(con, purpose=PURPOSE_AGREEMENT)) == len(rows)
