"""Which task a request is, from its text: a small linear classifier, fitted on a shipped set.

The features are what separates the tasks cheaply: the instruction's words and word pairs,
code and math symbols, fences and indentation, and - for summaries - whether the request
supplies a document and how much of the question's wording that document contains (a question
about a document is answered by copying from it, as a summary is). A multinomial logistic
regression is fitted on `data/task_prompts.jsonl` (hand-written for specreg, a few hundred
prompts across the six tasks); prediction is a dictionary lookup per feature in plain Python,
a few tens of microseconds, so it adds nothing measurable to a request.

`heuristic_task` is the user's own documented rule (their "adaptive speculative controller"
design: code when more than 5 % of the characters are brackets, semicolons or colons or the
text has a code fence; math on a few symbols and words; JSON when the text starts with a brace
or names a "type" key; prose otherwise), kept so the benchmark can print both accuracies.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

from specreg.errors import UsageError
from specreg.terms import TASKS, canonical_task

PROMPT_SET = "task_prompts.jsonl"
WORD = re.compile(r"[a-z_]+|\d+")
SYMBOLS = "{}()[];:=<>#\"'`$*/+-^|\\%&@~∑∫√∀∃→⇒π"
_STOP = """the a an and or of to in on for with from that this these those is are was were be
been it its as at by what which who how why when where do does did can could would should please
me my i you your we our they their there here about into than then them"""
STOPWORDS = frozenset(_STOP.split())
# Long requests are classified on their first characters: the instruction is near the start
# or the end, and a 100 kB document must not cost milliseconds.
MAX_QUESTION_CHARS = 4000
MAX_DOCUMENT_CHARS = 20000
# A paragraph counts as a supplied document when it is this long and most of the text.
DOCUMENT_MIN_CHARS = 160
DOCUMENT_MIN_SHARE = 0.5


@dataclass(frozen=True)
class RequestText:
    """What a request asks (`question`) apart from what it supplies (`document`)."""

    question: str
    document: str = ""
    system: str = ""

    @property
    def overlap(self) -> float:
        """Share of the question's content words that occur in the document (0 without one)."""
        if not self.document:
            return 0.0
        q = _content_words(self.question[:MAX_QUESTION_CHARS])
        if not q:
            return 0.0
        d = set(WORD.findall(self.document[:MAX_DOCUMENT_CHARS].lower()))
        return sum(w in d for w in q) / len(q)


def _content_words(text: str) -> set[str]:
    return {w for w in WORD.findall(text.lower()) if len(w) >= 4 and w not in STOPWORDS}


def split_document(text: str, system: str = "") -> RequestText:
    """Separate a supplied document (the longest paragraph, when it dominates) from the ask."""
    paragraphs = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
    if len(paragraphs) >= 2:
        longest = max(paragraphs, key=len)
        if len(longest) >= DOCUMENT_MIN_CHARS and len(longest) >= DOCUMENT_MIN_SHARE * len(text):
            rest = "\n\n".join(p for p in paragraphs if p is not longest)
            return RequestText(question=rest, document=longest, system=system)
    return RequestText(question=text, system=system)


def _bin(value: float, edges: Sequence[float]) -> int:
    return sum(value >= e for e in edges)


def features(rt: RequestText) -> dict[str, float]:
    """Binary features of a request, by name."""
    q = rt.question[:MAX_QUESTION_CHARS]
    full = q + "\n" + rt.document[:MAX_DOCUMENT_CHARS]
    low = q.lower()
    f: dict[str, float] = {}
    words = ["<num>" if w.isdigit() else w for w in WORD.findall(low)]
    for w in words:
        f["w:" + w] = 1.0
    for a, b in zip(words[:60], words[1:61], strict=False):
        f[f"b:{a}_{b}"] = 1.0
    for w in WORD.findall(rt.system[:1000].lower()):
        f["s:" + w] = 1.0
    for ch in SYMBOLS:
        if ch in full:
            f["c:" + ch] = 1.0
    n = max(1, len(full))
    code_chars = sum(full.count(c) for c in "{}()[];:")
    f[f"codefrac:{_bin(code_chars / n, (0.005, 0.02, 0.05, 0.1))}"] = 1.0
    digits = sum(c.isdigit() for c in q)
    f[f"digitfrac:{_bin(digits / max(1, len(q)), (0.01, 0.05, 0.15))}"] = 1.0
    if "```" in full:
        f["fence"] = 1.0
    if full.lstrip().startswith(("{", "[")):
        f["starts-brace"] = 1.0
    if re.search(r"^(?: {4}|\t)\S", full, re.M):
        f["indent"] = 1.0
    if re.search(r"\d\s*[-+*/^=]\s*\d|\b[a-z]\s*[\^=]\s*\d", low):
        f["arith"] = 1.0
    f[f"qlen:{_bin(len(q), (40, 80, 160, 320))}"] = 1.0
    if rt.document:
        f["doc"] = 1.0
        f[f"doclen:{_bin(len(rt.document), (400, 1500, 6000))}"] = 1.0
        f[f"overlap:{_bin(rt.overlap, (0.2, 0.4, 0.7))}"] = 1.0
        for w in set(WORD.findall(rt.document[:2000].lower())):
            f["d:" + w] = 0.5
    return f


def _as_request(x: str | RequestText) -> RequestText:
    return x if isinstance(x, RequestText) else split_document(x)


class TaskClassifier:
    """Multinomial logistic regression over `features`, scikit-learn's estimator contract.

    `fit` uses scikit-learn; the fitted weights are kept as a plain mapping so `predict` needs
    neither numpy nor a vectorizer per request.
    """

    def __init__(self, C: float = 4.0, random_state: int = 0):
        self.C = C
        self.random_state = random_state

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {"C": self.C, "random_state": self.random_state}

    def set_params(self, **params: Any) -> TaskClassifier:
        for k, v in params.items():
            setattr(self, k, v)
        return self

    def fit(self, X: Iterable[str | RequestText], y: Iterable[str]) -> TaskClassifier:
        from sklearn.feature_extraction import DictVectorizer
        from sklearn.linear_model import LogisticRegression

        rows = [features(_as_request(x)) for x in X]
        vec = DictVectorizer()
        matrix = vec.fit_transform(rows)
        model = LogisticRegression(C=self.C, max_iter=5000, random_state=self.random_state)
        model.fit(matrix, list(y))
        self.classes_: tuple[str, ...] = tuple(str(c) for c in model.classes_)
        self.intercept_: tuple[float, ...] = tuple(float(v) for v in model.intercept_)
        coef = model.coef_
        self.weights_: dict[str, tuple[float, ...]] = {
            name: tuple(float(coef[k, j]) for k in range(len(self.classes_)))
            for name, j in vec.vocabulary_.items()
        }
        return self

    def scores(self, x: str | RequestText) -> dict[str, float]:
        """Class probabilities for one request."""
        total = list(self.intercept_)
        for name, value in features(_as_request(x)).items():
            w = self.weights_.get(name)
            if w is not None:
                for k, wk in enumerate(w):
                    total[k] += wk * value
        top = max(total)
        exp = [math.exp(t - top) for t in total]
        z = sum(exp)
        return {c: e / z for c, e in zip(self.classes_, exp, strict=True)}

    def predict_one(self, x: str | RequestText) -> tuple[str, float]:
        probs = self.scores(x)
        task = max(probs, key=lambda c: probs[c])
        return task, probs[task]

    def predict(self, X: Iterable[str | RequestText]) -> list[str]:
        return [self.predict_one(x)[0] for x in X]

    def score(self, X: Sequence[str | RequestText], y: Sequence[str]) -> float:
        pred = self.predict(X)
        return sum(p == t for p, t in zip(pred, y, strict=True)) / max(1, len(y))


# -- the user's documented rule --------------------------------------------------------------

_MATH_SIGNS = ("∑", "∀", "∃", "→", "⇒", "therefore", "proof", "∫")


def heuristic_task(text: str) -> str:
    """The user's character-count rule: code, math, json or prose (it has no other tasks)."""
    code_chars = sum(1 for c in text if c in "{}()[];:")
    if code_chars > len(text) * 0.05 or "```" in text:
        return "code"
    if any(sign in text for sign in _MATH_SIGNS):
        return "math"
    if text.strip().startswith("{") or '"type":' in text:
        return "json"
    return "prose"


# -- the shipped labelled set ------------------------------------------------------------------


@dataclass(frozen=True)
class LabelledPrompt:
    prompt_id: str
    task: str
    text: str


def labelled_prompts() -> tuple[LabelledPrompt, ...]:
    """The prompt set the classifier is fitted on (hand-written for specreg, MIT)."""
    raw = files("specreg.serve").joinpath("data").joinpath(PROMPT_SET).read_text(encoding="utf-8")
    out = []
    for line in raw.splitlines():
        if line.strip():
            item = json.loads(line)
            out.append(LabelledPrompt(item["id"], item["task"], item["text"]))
    return tuple(out)


def fitted_classifier() -> TaskClassifier:
    prompts = labelled_prompts()
    return TaskClassifier().fit([p.text for p in prompts], [p.task for p in prompts])


# -- a request's task ------------------------------------------------------------------------

TASK_HEADER = "x-specreg-task"
SOURCE_HEADER = "header"
SOURCE_MODEL = "model"
SOURCE_CLASSIFIER = "classifier"


@dataclass(frozen=True)
class Classification:
    task: str
    source: str  # header | model | classifier
    confidence: float | None = None


def forced_task(value: str, where: str) -> str:
    """A task a client named (header or `model` suffix), as its canonical name."""
    task = canonical_task(value.strip().lower())
    if task not in TASKS:
        raise UsageError(f"unknown task {value!r} in the {where}: use one of {', '.join(TASKS)}")
    return task


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: [{"type": "text", "text": ...}]
        return "\n".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return ""


def request_text(body: Mapping[str, Any]) -> RequestText:
    """The text to classify from an OpenAI chat or completion body."""
    messages = body.get("messages")
    if isinstance(messages, list):
        system = "\n".join(
            _content_text(m.get("content"))
            for m in messages
            if isinstance(m, dict) and m.get("role") in ("system", "developer")
        )
        turns = [
            _content_text(m.get("content"))
            for m in messages
            if isinstance(m, dict) and m.get("role") == "user"
        ]
        last = turns[-1] if turns else ""
        rt = split_document(last, system)
        if not rt.document:
            earlier = max(turns[:-1], key=len, default="")
            if len(earlier) >= DOCUMENT_MIN_CHARS:
                rt = RequestText(question=last, document=earlier, system=system)
        return rt
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = prompt[0] if prompt and isinstance(prompt[0], str) else ""
    return split_document(prompt if isinstance(prompt, str) else "")


def classify(
    classifier: TaskClassifier,
    body: Mapping[str, Any],
    *,
    header: str | None = None,
    model_task: str | None = None,
) -> Classification:
    """The header wins, then a `model` suffix (`target:code`), then the classifier."""
    if header:
        return Classification(forced_task(header, f"{TASK_HEADER} header"), SOURCE_HEADER)
    if model_task:
        return Classification(forced_task(model_task, "model name"), SOURCE_MODEL)
    task, p = classifier.predict_one(request_text(body))
    return Classification(task, SOURCE_CLASSIFIER, p)
