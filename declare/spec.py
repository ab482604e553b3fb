"""specreg.yaml: the user's declaration, loaded strictly and saved without losing a comment.

The file is read with ruamel.yaml in round-trip mode. `load_spec` returns both the validated,
frozen `Spec` (what the rest of the code reasons about) and the `CommentedMap` it came from
(what `propose`/`apply`/`import` edit in place, so comments and key order survive).

Units are part of the schema: acceptance is a fraction in [0, 1], speed is tokens per second,
and the number of drafted tokens is spelled `draft_max` only. Every error names the file, the
line, the dotted key and what was expected.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError

from specreg.declare import SPEC_FILENAME
from specreg.errors import UsageError
from specreg.registry.stores import STORES
from specreg.stacks import NGRAM_CACHE, StackError, parse_stack
from specreg.terms import (
    DIALECT_AUTO,
    DRAFT_MODEL_TYPES,
    METHOD_OF,
    POLICIES,
    POLICY_QUALITY,
    SPEC_DRAFT_SIMPLE,
    SPEC_FILE_DIALECTS,
    SPEC_NONE,
    Method,
)
from specreg.terms import SPEC_TYPES as TERMS_SPEC_TYPES

SPEC_VERSION = 1

# What `llama.dialect` may say: a flag dialect of specreg.terms, or auto (probe the build).
LLAMA_DIALECT_CHOICES = (DIALECT_AUTO, *SPEC_FILE_DIALECTS)
# What a role may forbid (`forbid:`): a method of specreg.terms, or a draft head type of its own.
_OWN_KIND = {"draft-eagle3": "eagle3", "draft-dflash": "dflash", "draft-dspark": "dspark"}
FORBIDDABLE_KINDS = ("draft", "ngram", "mtp", "eagle3", "dflash", "dspark")
# llama.cpp's speculative types (specreg.terms.SPEC_TYPES), each with what `forbid:` calls it
# (None: plain decoding, never forbidden).
FORBID_KIND_OF: dict[str, str | None] = {
    t: None if METHOD_OF[t] is Method.NONE else _OWN_KIND.get(t, METHOD_OF[t].value)
    for t in TERMS_SPEC_TYPES
}

# Spellings other tools and hand-written registries use, pointed at the one specreg accepts.
K_SPELLINGS = ("k", "draft_k", "speculative_k", "draft-max", "spec_draft_n_max", "n_draft")
ACCEPTANCE_SPELLINGS = ("acceptance_rate", "accept_rate", "spec_acceptance", "draft_accept_rate")
_MODEL_ID = re.compile(r"^[0-9a-zA-Z][0-9a-zA-Z_.:-]{3,127}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}$")


class SpecFileError(UsageError):
    """specreg.yaml (or a proposal) does not follow the schema; the message says where and why."""

    def __init__(self, file: str, line: int | None, key: str, expected: str) -> None:
        self.file, self.line, self.key, self.expected = file, line, key, expected
        at = f"{file}:{line}" if line is not None else file
        super().__init__(f"{at}: {key}: {expected}")


@dataclass(frozen=True)
class Where:
    """Where a value was declared: shown next to findings and as the origin of launch flags."""

    file: str
    line: int | None
    key: str

    def __str__(self) -> str:
        return f"{self.key} ({Path(self.file).name}:{self.line})" if self.line else self.key


@dataclass(frozen=True)
class Evidence:
    """The measurement a pinned configuration rests on. Units: tokens/s and a fraction."""

    tokens_per_s: float | None = None
    baseline_tokens_per_s: float | None = None
    acceptance: float | None = None
    runs: tuple[str, ...] = ()
    protocol: str | None = None
    host: str | None = None
    date: str | None = None
    source: str | None = None


@dataclass(frozen=True)
class ServerArgsDecl:
    """`llama_server_args:` of a model or a role: llama-server flags of the user's own, added
    after specreg's wherever that model is the target, or that role runs."""

    args: tuple[str, ...]
    where: Where


@dataclass(frozen=True)
class ModelDecl:
    id: str  # the registry's model_id: the fingerprint of the GGUF header
    path: str | None  # where it was last seen (a hint; the id is what identifies it)
    aliases: tuple[str, ...]
    where: Where
    server_args: ServerArgsDecl | None = None

    @property
    def label(self) -> str:
        return self.aliases[0] if self.aliases else self.id


@dataclass(frozen=True)
class PinnedConfig:
    task: str
    spec_types: tuple[str, ...]
    draft: str | None
    draft_max: int | None
    draft_p_min: float | None
    experts: int | None
    evidence: Evidence | None
    where: Where
    # line of each declared field, so every launch flag can say where it came from
    lines: Mapping[str, int | None] = field(default_factory=dict)
    lookup_cache: str | None = None  # a `specreg lookup-cache` name, read by ngram-cache
    # its place in a candidate set (`configs.<task>` a list: `serve --policy adaptive` chooses
    # among them per request); None for a configuration pinned alone
    member: int | None = None

    @property
    def name(self) -> str:
        """The task, with the place in its candidate set (`code[1]`) for a member."""
        return self.task if self.member is None else f"{self.task}[{self.member}]"

    def field_where(self, name: str) -> Where:
        return Where(
            self.where.file, self.lines.get(name, self.where.line), f"{self.where.key}.{name}"
        )

    @property
    def families(self) -> tuple[str, ...]:
        return tuple(f for t in self.spec_types if (f := FORBID_KIND_OF[t]) is not None)


@dataclass(frozen=True)
class RoleDecl:
    name: str
    target: str
    policy: str
    forbid: tuple[str, ...]
    configs: tuple[PinnedConfig, ...]
    where: Where
    target_where: Where
    max_kld: float | None = None  # quality budget of lossy knobs (mean KL divergence)
    server_args: ServerArgsDecl | None = None


@dataclass(frozen=True)
class LlamaDecl:
    bin_dir: str | None = None
    dialect: str = "auto"
    threads: int | None = None
    numa: str | None = None
    where: Where | None = None
    lines: Mapping[str, int | None] = field(default_factory=dict)

    def field_where(self, name: str) -> Where:
        file = self.where.file if self.where else SPEC_FILENAME
        return Where(file, self.lines.get(name), f"llama.{name}")


@dataclass(frozen=True)
class Spec:
    path: Path
    llama: LlamaDecl
    roots: tuple[str, ...]
    stores: tuple[str, ...]
    exclude: tuple[str, ...]
    models: tuple[ModelDecl, ...]
    roles: tuple[RoleDecl, ...]

    @property
    def base_dir(self) -> Path:
        return self.path.parent

    def resolve_path(self, p: str) -> Path:
        path = Path(p).expanduser()
        return path if path.is_absolute() else (self.base_dir / path)

    def role(self, name: str) -> RoleDecl:
        """The declared role `name`; a UsageError lists the roles there are."""
        found = next((r for r in self.roles if r.name == name), None)
        if found is None:
            names = ", ".join(r.name for r in self.roles) or "none"
            raise UsageError(f"no role {name!r} in {self.path} (roles: {names})")
        return found

    def model(self, ref: str) -> ModelDecl | None:
        """A declared model by id, unique id prefix (8+ characters) or alias."""
        for m in self.models:
            if ref == m.id or ref in m.aliases:
                return m
        if len(ref) >= 8:
            hits = [m for m in self.models if m.id.startswith(ref)]
            if len(hits) == 1:
                return hits[0]
        return None


# ---------------------------------------------------------------------------------------------
# YAML plumbing


def yaml_rt() -> YAML:
    y = YAML()  # round-trip: comments, key order and flow style survive
    y.preserve_quotes = True
    y.indent(mapping=2, sequence=4, offset=2)
    y.width = 4096  # never fold a long path onto the next line
    return y


def read_yaml(path: Path) -> CommentedMap:
    if not path.exists():
        raise UsageError(
            f"{path}: no such file (create one with `specreg import` or `specreg init`)"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"{path}: cannot read: {err}") from err
    try:
        doc = yaml_rt().load(text)
    except MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = (err.problem or "not valid YAML").strip()
        if "duplicate key" in problem:
            problem += " (each fact is declared once; remove one of them)"
        raise SpecFileError(str(path), line, "(yaml)", problem) from err
    if doc is None:
        doc = CommentedMap()
    if not isinstance(doc, CommentedMap):
        raise SpecFileError(str(path), 1, "(top level)", "expected a mapping")
    return doc


def dump_yaml(doc: Any) -> str:
    buf = io.StringIO()
    yaml_rt().dump(doc, buf)
    return buf.getvalue()


def write_yaml(path: Path, doc: Any) -> None:
    """Write atomically: a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(dump_yaml(doc), encoding="utf-8")
    tmp.replace(path)


def key_line(node: Any, key: Any) -> int | None:
    try:
        if isinstance(node, CommentedMap):
            return int(node.lc.key(key)[0]) + 1
        if isinstance(node, CommentedSeq):
            return int(node.lc.item(key)[0]) + 1
    except (KeyError, IndexError, TypeError, AttributeError):
        pass
    return None


def node_line(node: Any) -> int | None:
    lc = getattr(node, "lc", None)
    return int(lc.line) + 1 if lc is not None and lc.line is not None else None


# ---------------------------------------------------------------------------------------------
# Validation


class _Checker:
    def __init__(self, file: str) -> None:
        self.file = file

    def fail(self, parent: Any, key: Any, dotted: str, expected: str) -> SpecFileError:
        line = key_line(parent, key) if key is not None else node_line(parent)
        return SpecFileError(self.file, line, dotted, expected)

    def expected(
        self, parent: Any, key: Any, dotted: str, what: str, hint: str = ""
    ) -> SpecFileError:
        """The error for a value that is not `what`: "expected WHAT, got VALUE"."""
        return self.fail(parent, key, dotted, f"expected {what}, got {_show(parent[key])}{hint}")

    def where(self, parent: Any, key: Any, dotted: str) -> Where:
        return Where(self.file, key_line(parent, key), dotted)

    def mapping(
        self,
        parent: Any,
        key: Any,
        dotted: str,
        allowed: Mapping[str, str] | None,
        hints: Mapping[str, str] | None = None,
    ) -> CommentedMap:
        node = parent[key] if key is not None else parent
        if node is None:
            node = CommentedMap()
        if not isinstance(node, CommentedMap):
            raise self.fail(parent, key, dotted, f"expected a mapping, got {_kind(node)}")
        if allowed is not None:
            for k in node:
                if not isinstance(k, str):
                    raise self.fail(node, k, f"{dotted}.{k}", "keys must be strings")
                if k not in allowed:
                    hint = (hints or {}).get(k)
                    known = ", ".join(allowed)
                    msg = (
                        f"unknown key; {hint}"
                        if hint
                        else f"unknown key (expected one of: {known})"
                    )
                    raise self.fail(node, k, f"{dotted}.{k}" if dotted else k, msg)
        return node

    def items(self, node: CommentedMap, dotted: str) -> Iterator[tuple[str, Any, str]]:
        for k in node:
            yield str(k), node[k], f"{dotted}.{k}" if dotted else str(k)

    def string(
        self,
        parent: Any,
        key: Any,
        dotted: str,
        *,
        pattern: re.Pattern[str] | None = None,
        what: str = "a string",
    ) -> str:
        v = parent[key]
        if (
            not isinstance(v, str)
            or not v.strip()
            or (pattern is not None and not pattern.match(v))
        ):
            raise self.expected(parent, key, dotted, what)
        return str(v)

    def choice(self, parent: Any, key: Any, dotted: str, choices: tuple[str, ...]) -> str:
        v = parent[key]
        if v not in choices:
            raise self.expected(parent, key, dotted, f"one of {', '.join(choices)}")
        return str(v)

    def integer(self, parent: Any, key: Any, dotted: str, lo: int, hi: int, unit: str) -> int:
        v = parent[key]
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise self.expected(parent, key, dotted, f"an integer {lo}..{hi} ({unit})")
        return int(v)

    def number(
        self,
        parent: Any,
        key: Any,
        dotted: str,
        lo: float,
        hi: float | None,
        unit: str,
        hint: str = "",
    ) -> float:
        v = parent[key]
        ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        if ok and (v < lo or (hi is not None and v > hi)):
            ok = False
        if not ok:
            rng = f"{lo:g}..{hi:g}" if hi is not None else f">= {lo:g}"
            raise self.expected(parent, key, dotted, f"a number {rng} ({unit})", hint)
        return float(v)

    def str_list(
        self,
        parent: Any,
        key: Any,
        dotted: str,
        *,
        choices: tuple[str, ...] | None = None,
        what: str = "strings",
    ) -> tuple[str, ...]:
        v = parent[key]
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list):
            raise self.expected(parent, key, dotted, f"a list of {what}")
        out = []
        for i, item in enumerate(v):
            if not isinstance(item, str) or not item:
                raise self.expected(v, i, f"{dotted}[{i}]", what)
            if choices is not None and item not in choices:
                raise self.expected(v, i, f"{dotted}[{i}]", f"one of {', '.join(choices)}")
            out.append(str(item))
        if len(set(out)) != len(out):
            raise self.fail(parent, key, dotted, "expected each entry once (duplicates found)")
        return tuple(out)


def _kind(v: Any) -> str:
    if isinstance(v, Mapping):
        return "a mapping"
    if isinstance(v, list):
        return "a list"
    return _show(v)


def _show(v: Any) -> str:
    if isinstance(v, str):
        return repr(v)
    if v is None:
        return "nothing"
    if isinstance(v, (Mapping, list)):
        return _kind(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(int(v))
    if isinstance(v, float):
        return f"{float(v):g}"
    return f"{v} ({type(v).__name__})"


TOP_KEYS = {
    "version": "schema version",
    "llama": "llama.cpp binaries and host settings",
    "roots": "folders to scan",
    "stores": "model stores to discover",
    "exclude": "glob patterns to skip",
    "models": "models by fingerprint",
    "roles": "roles binding models",
}
LLAMA_KEYS = {"bin_dir": "", "dialect": "", "threads": "", "numa": ""}
MODEL_KEYS = {"path": "", "aliases": "", "note": "", "llama_server_args": ""}
MODEL_HINTS = {
    "quant": "the quant is read from the GGUF header, not declared",
    "size_gb": "the size is read from disk, not declared",
    "architecture": "the architecture is read from the GGUF header, not declared",
    "split_count": "split parts are read from the GGUF header (split.count), not declared",
    "name": "use aliases: [...] for names",
    "server_args": "spelled llama_server_args",
    "llama_args": "spelled llama_server_args",
}
ROLE_KEYS = {
    "target": "",
    "policy": "",
    "forbid": "",
    "configs": "",
    "note": "",
    "max_kld": "",
    "llama_server_args": "",
}
ROLE_HINTS = {
    "draft": "drafts are pinned per task under configs.<task>.draft",
    "compatible_targets": "compatibility is decided by the auditor from GGUF metadata",
    "acceleration": "write configs.<task> with spec_type/draft/draft_max/experts",
    "server_args": "spelled llama_server_args",
    "llama_args": "spelled llama_server_args",
}
CONFIG_KEYS = {
    "spec_type": "",
    "draft": "",
    "draft_max": "",
    "draft_p_min": "",
    "experts": "",
    "lookup_cache": "",
    "evidence": "",
    "note": "",
}
EVIDENCE_KEYS = {
    "tokens_per_s": "",
    "baseline_tokens_per_s": "",
    "acceptance": "",
    "runs": "",
    "protocol": "",
    "host": "",
    "date": "",
    "source": "",
}
_K_HINT = "K is spelled draft_max (drafted tokens per step)"
CONFIG_HINTS = (
    {k: _K_HINT for k in K_SPELLINGS}
    | {a: "acceptance is evidence.acceptance (a fraction)" for a in ACCEPTANCE_SPELLINGS}
    | {
        "lookup": "prompt lookup is spec_type: ngram-cache (or another ngram-* type)",
        "lookup_cache_static": "spelled lookup_cache: NAME (see `specreg lookup-cache list`)",
        "lcs": "spelled lookup_cache: NAME (see `specreg lookup-cache list`)",
        "override_key": "the key comes from the GGUF (expert_used_count); declare experts: N only",
        "tps": "speeds go in evidence.tokens_per_s",
    }
)
EVIDENCE_HINTS = {
    a: "acceptance is spelled acceptance (a fraction in 0..1)" for a in ACCEPTANCE_SPELLINGS
} | {
    "tps": "spelled tokens_per_s",
    "speed": "spelled tokens_per_s",
    "baseline_tps": "spelled baseline_tokens_per_s",
}


def load_spec(path: Path) -> tuple[Spec, CommentedMap]:
    """Read and validate specreg.yaml; a SpecFileError names file, line, key and expectation."""
    doc = read_yaml(path)
    return validate(doc, path), doc


def validate(doc: CommentedMap, path: Path) -> Spec:
    """The `Spec` of a parsed specreg.yaml, checked key by key (a `SpecFileError` names the
    file, line, dotted key and what was expected)."""
    c = _Checker(str(path))
    top = c.mapping(doc, None, "", TOP_KEYS)
    _check_version(c, top, path)
    llama = _llama(c, top)
    roots = c.str_list(top, "roots", "roots", what="folder paths") if "roots" in top else ()
    stores = c.str_list(top, "stores", "stores", choices=STORES) if "stores" in top else ()
    exclude = (
        c.str_list(top, "exclude", "exclude", what="glob patterns") if "exclude" in top else ()
    )
    models = _models(c, top)
    return Spec(
        path=path,
        llama=llama,
        roots=roots,
        stores=stores,
        exclude=exclude,
        models=models,
        roles=_roles(c, top, _model_ref(c, models)),
    )


ModelRef = Callable[[Any, str, str], str]
"""Checks that `parent[key]` names a declared model (id, alias or unique id prefix)."""


def _check_version(c: _Checker, top: CommentedMap, path: Path) -> None:
    if "version" not in top:
        raise SpecFileError(str(path), 1, "version", f"missing (expected version: {SPEC_VERSION})")
    if top["version"] != SPEC_VERSION:
        raise c.expected(top, "version", "version", str(SPEC_VERSION))


def _llama(c: _Checker, top: CommentedMap) -> LlamaDecl:
    """`llama:`, the build and flags every launch uses."""
    if "llama" not in top:
        return LlamaDecl()
    ln = c.mapping(top, "llama", "llama", LLAMA_KEYS)
    return LlamaDecl(
        bin_dir=c.string(ln, "bin_dir", "llama.bin_dir", what="a folder")
        if "bin_dir" in ln
        else None,
        dialect=c.choice(ln, "dialect", "llama.dialect", LLAMA_DIALECT_CHOICES)
        if "dialect" in ln
        else DIALECT_AUTO,
        threads=c.integer(ln, "threads", "llama.threads", 1, 4096, "threads")
        if "threads" in ln
        else None,
        numa=c.string(ln, "numa", "llama.numa") if "numa" in ln else None,
        where=c.where(top, "llama", "llama"),
        lines={k: key_line(ln, k) for k in ln},
    )


def _models(c: _Checker, top: CommentedMap) -> tuple[ModelDecl, ...]:
    """`models:`, each by id with its path and aliases (an alias names one model only)."""
    if "models" not in top:
        return ()
    models: list[ModelDecl] = []
    seen_names: dict[str, str] = {}
    mn = c.mapping(top, "models", "models", None)
    for mid, _node, dotted in c.items(mn, "models"):
        if not _MODEL_ID.match(mid):
            raise c.fail(
                mn, mid, dotted, "expected a model id (the fingerprint `specreg show` prints)"
            )
        m = c.mapping(mn, mid, dotted, MODEL_KEYS, MODEL_HINTS)
        aliases = _aliases(c, m, mid, dotted, seen_names)
        models.append(
            ModelDecl(
                id=mid,
                path=c.string(m, "path", f"{dotted}.path", what="a file path")
                if "path" in m
                else None,
                aliases=aliases,
                where=c.where(mn, mid, dotted),
                server_args=_server_args(c, m, dotted),
            )
        )
    return tuple(models)


def _server_args(c: _Checker, node: CommentedMap, dotted: str) -> ServerArgsDecl | None:
    """`llama_server_args:` (a list of flags, or one string of them), none of the flags specreg
    sets itself."""
    from specreg.llama.config import user_server_args

    key = "llama_server_args"
    if key not in node:
        return None
    tokens = c.str_list(node, key, f"{dotted}.{key}", what="llama-server flags")
    where = c.where(node, key, f"{dotted}.{key}")
    try:
        args = user_server_args(tokens, where.key).args
    except UsageError as err:
        problem = str(err).removeprefix(f"{where.key}: ")
        raise c.fail(node, key, where.key, problem) from err
    return ServerArgsDecl(args, where)


def _aliases(
    c: _Checker, m: CommentedMap, mid: str, dotted: str, seen_names: dict[str, str]
) -> tuple[str, ...]:
    """A model's aliases, each a name not taken by another model (recorded in `seen_names`)."""
    if "aliases" not in m:
        return ()
    aliases = c.str_list(m, "aliases", f"{dotted}.aliases", what="names")
    for a in aliases:
        if not _NAME.match(a):
            raise c.fail(
                m, "aliases", f"{dotted}.aliases",
                f"expected a name of letters, digits, _.+-, got {a!r}",
            )  # fmt: skip
        if a in seen_names:
            raise c.fail(
                m, "aliases", f"{dotted}.aliases",
                f"alias {a!r} already names models.{seen_names[a]} (one alias, one model)",
            )  # fmt: skip
        seen_names[a] = mid
    return aliases


def _model_ref(c: _Checker, models: tuple[ModelDecl, ...]) -> ModelRef:
    def ref(parent: Any, key: str, dotted: str) -> str:
        r = c.string(parent, key, dotted, what="a model id or alias declared under models")
        if not any(r == m.id or r in m.aliases for m in models) and not (
            len(r) >= 8 and sum(m.id.startswith(r) for m in models) == 1
        ):
            raise c.fail(
                parent, key, dotted,
                f"expected a model id or alias declared under models, got {r!r}",
            )  # fmt: skip
        return r

    return ref


def _roles(c: _Checker, top: CommentedMap, ref: ModelRef) -> tuple[RoleDecl, ...]:
    """`roles:`, each a target with its policy, what it forbids and its pinned configs."""
    if "roles" not in top:
        return ()
    rn = c.mapping(top, "roles", "roles", None)
    return tuple(_role(c, rn, name, dotted, ref) for name, _node, dotted in c.items(rn, "roles"))


def _role(c: _Checker, rn: CommentedMap, name: str, dotted: str, ref: ModelRef) -> RoleDecl:
    if not _NAME.match(name):
        raise c.fail(rn, name, dotted, "expected a role name of letters, digits, _.+-")
    r = c.mapping(rn, name, dotted, ROLE_KEYS, ROLE_HINTS)
    if "target" not in r:
        raise c.fail(rn, name, dotted, "missing target: (the model this role serves)")
    target = ref(r, "target", f"{dotted}.target")
    policy = (
        c.choice(r, "policy", f"{dotted}.policy", POLICIES) if "policy" in r else POLICY_QUALITY
    )
    forbid = (
        c.str_list(r, "forbid", f"{dotted}.forbid", choices=FORBIDDABLE_KINDS)
        if "forbid" in r
        else ()
    )
    max_kld = (
        c.number(r, "max_kld", f"{dotted}.max_kld", 0.0, 100.0, "nats per token")
        if "max_kld" in r
        else None
    )
    configs: list[PinnedConfig] = []
    if "configs" in r:
        cn = c.mapping(r, "configs", f"{dotted}.configs", None)
        for task, cnode, cdot in c.items(cn, f"{dotted}.configs"):
            if isinstance(cnode, list):
                configs += _candidate_set(c, cn, task, cdot, policy, forbid, ref)
            else:
                configs.append(_config(c, cn, task, cdot, policy, forbid, ref))
    return RoleDecl(
        name=name,
        target=target,
        policy=policy,
        forbid=forbid,
        configs=tuple(configs),
        where=c.where(rn, name, dotted),
        target_where=c.where(r, "target", f"{dotted}.target"),
        max_kld=max_kld,
        server_args=_server_args(c, r, dotted),
    )


def _candidate_set(
    c: _Checker,
    cn: CommentedMap,
    task: str,
    dotted: str,
    policy: str,
    forbid: tuple[str, ...],
    ref: ModelRef,
) -> list[PinnedConfig]:
    """A task pinned to a candidate set (`roles.NAME.configs.TASK` a list of configurations):
    `serve --policy adaptive` chooses among them per request, and only among them."""
    seq = cn[task]
    if len(seq) < 2:
        raise c.fail(
            cn, task, dotted,
            "expected a candidate set of two or more configurations (one is written as a "
            "mapping, without the list)",
        )  # fmt: skip
    out = [
        replace(_config(c, seq, i, f"{dotted}[{i}]", policy, forbid, ref, task=task), member=i)
        for i in range(len(seq))
    ]
    seen: dict[tuple[object, ...], int] = {}
    for cfg in out:
        same = seen.setdefault(_launch_key(cfg), cfg.member or 0)
        if same != cfg.member:
            raise c.fail(
                seq, cfg.member, f"{dotted}[{cfg.member}]",
                f"expected each configuration once ({dotted}[{same}] is the same)",
            )  # fmt: skip
    return out


def _launch_key(cfg: PinnedConfig) -> tuple[object, ...]:
    """What decides how a pinned configuration runs (not its evidence, note or place)."""
    return (cfg.spec_types, cfg.draft, cfg.draft_max, cfg.draft_p_min, cfg.experts,
            cfg.lookup_cache)  # fmt: skip


def _config(
    c: _Checker,
    cn: Any,
    key: str | int,
    dotted: str,
    policy: str,
    forbid: tuple[str, ...],
    ref: ModelRef,
    *,
    task: str | None = None,
) -> PinnedConfig:
    """One pinned configuration of a role (`roles.NAME.configs.TASK`, or one member of its
    candidate set: `key` its index in the list, `task` the list's task)."""
    task = task if task is not None else str(key)
    n = c.mapping(cn, key, dotted, CONFIG_KEYS, CONFIG_HINTS)
    types = _stack_types(c, n, dotted)
    _check_draft(c, cn, n, key, dotted, types)
    draft = ref(n, "draft", f"{dotted}.draft") if "draft" in n else None
    lookup_cache = _lookup_cache(c, n, dotted, types)
    draft_max = (
        c.integer(n, "draft_max", f"{dotted}.draft_max", 1, 256, "drafted tokens per step")
        if "draft_max" in n
        else None
    )
    p_min = (
        c.number(n, "draft_p_min", f"{dotted}.draft_p_min", 0.0, 1.0, "a probability")
        if "draft_p_min" in n
        else None
    )
    experts = (
        c.integer(n, "experts", f"{dotted}.experts", 1, 1024, "experts used per token")
        if "experts" in n
        else None
    )
    _check_forbidden(c, n, dotted, types, forbid)
    if policy == POLICY_QUALITY and experts is not None:
        raise c.fail(
            n, "experts", f"{dotted}.experts",
            "policy quality runs all experts; remove experts or set policy: speed",
        )  # fmt: skip
    return PinnedConfig(
        task=task,
        spec_types=types,
        draft=draft,
        draft_max=draft_max,
        draft_p_min=p_min,
        experts=experts,
        evidence=_evidence(c, n, dotted) if "evidence" in n else None,
        lookup_cache=lookup_cache,
        where=c.where(cn, key, dotted),
        lines={k: key_line(n, k) for k in n},
    )


def _stack_types(c: _Checker, n: CommentedMap, dotted: str) -> tuple[str, ...]:
    """The config's speculative types in llama.cpp's order: `spec_type` (a list, or llama.cpp's
    comma spelling), else draft-simple with a draft and plain decoding without."""
    if "spec_type" not in n:
        return (SPEC_DRAFT_SIMPLE,) if "draft" in n else (SPEC_NONE,)
    raw = n["spec_type"]
    if isinstance(raw, str) and "," in raw:  # llama.cpp's own spelling of a stack
        types = tuple(t.strip() for t in raw.split(","))
    else:
        types = c.str_list(n, "spec_type", f"{dotted}.spec_type", choices=tuple(FORBID_KIND_OF))
    try:
        return parse_stack(types).types or (SPEC_NONE,)
    except StackError as err:
        raise c.fail(n, "spec_type", f"{dotted}.spec_type", str(err)) from err


def _check_draft(
    c: _Checker, cn: Any, n: CommentedMap, key: str | int, dotted: str, types: tuple[str, ...]
) -> None:
    """A draft model is given exactly when a type of the stack reads one."""
    needs_draft = [t for t in types if t in DRAFT_MODEL_TYPES]
    if needs_draft and "draft" not in n:
        raise c.fail(cn, key, dotted, f"spec_type {needs_draft[0]} needs draft: (a declared model)")
    if "draft" in n and not needs_draft:
        raise c.fail(
            n, "draft", f"{dotted}.draft",
            f"a draft model needs a draft-* spec_type ({SPEC_DRAFT_SIMPLE}), got "
            f"{', '.join(types)}",
        )  # fmt: skip


def _lookup_cache(c: _Checker, n: CommentedMap, dotted: str, types: tuple[str, ...]) -> str | None:
    if "lookup_cache" not in n:
        return None
    lookup_cache = c.string(n, "lookup_cache", f"{dotted}.lookup_cache")
    if NGRAM_CACHE not in types:
        raise c.fail(
            n, "lookup_cache", f"{dotted}.lookup_cache",
            "a lookup cache is read by ngram-cache only: add ngram-cache to spec_type "
            f"(got {', '.join(types)})",
        )  # fmt: skip
    return lookup_cache


def _check_forbidden(
    c: _Checker, n: CommentedMap, dotted: str, types: tuple[str, ...], forbid: tuple[str, ...]
) -> None:
    """No type of the stack is of a kind the role forbids."""
    for t in types:
        kind = FORBID_KIND_OF[t]
        if kind is not None and kind in forbid:
            raise c.fail(
                n, "spec_type" if "spec_type" in n else "draft", f"{dotted}.spec_type",
                f"{t} is forbidden for this role (forbid: {', '.join(forbid)})",
            )  # fmt: skip


def _evidence(c: _Checker, n: CommentedMap, dotted: str) -> Evidence:
    """`evidence:` of a pinned config: what was measured, in specreg's units."""
    e = c.mapping(n, "evidence", f"{dotted}.evidence", EVIDENCE_KEYS, EVIDENCE_HINTS)
    ed = f"{dotted}.evidence"
    acc_hint = ""
    if "acceptance" in e and isinstance(e["acceptance"], (int, float, str)):
        acc_hint = _acceptance_hint(e["acceptance"])
    return Evidence(
        tokens_per_s=c.number(e, "tokens_per_s", f"{ed}.tokens_per_s", 0.0, None, "tokens/s")
        if "tokens_per_s" in e
        else None,
        baseline_tokens_per_s=c.number(
            e, "baseline_tokens_per_s", f"{ed}.baseline_tokens_per_s", 0.0, None, "tokens/s"
        )
        if "baseline_tokens_per_s" in e
        else None,
        acceptance=c.number(e, "acceptance", f"{ed}.acceptance", 0.0, 1.0, "a fraction", acc_hint)
        if "acceptance" in e
        else None,
        runs=c.str_list(e, "runs", f"{ed}.runs", what="run ids") if "runs" in e else (),
        protocol=_opt_str(c, e, "protocol", ed),
        host=_opt_str(c, e, "host", ed),
        date=_opt_str(c, e, "date", ed),
        source=_opt_str(c, e, "source", ed),
    )


def _opt_str(c: _Checker, e: CommentedMap, key: str, ed: str) -> str | None:
    if key not in e:
        return None
    v = e[key]
    if not isinstance(v, str):
        v = str(v)  # dates written bare are parsed by YAML as dates; keep their text
    return v


def _acceptance_hint(v: Any) -> str:
    if isinstance(v, str) and v.strip().endswith("%"):
        try:
            return f" (write {float(v.strip()[:-1]) / 100:.4g}, not {v!r})"
        except ValueError:
            return ""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and 1 < v <= 100:
        return f" (if {v:g} is a percentage, write {v / 100:.4g})"
    return ""
