"""The fixtures every part's tests use. Test data is generated in code; the real vocab GGUFs
come from the pinned llama.cpp sdist, fetched once into the cache."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from gguf import GGUFWriter

from support import REPO, require

if TYPE_CHECKING:
    from specreg.samples.demo import DemoModel


@pytest.fixture(autouse=True)
def specreg_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own SPECREG_HOME; the download/build cache stays shared."""
    home = tmp_path / "specreg-home"
    monkeypatch.setenv("SPECREG_HOME", str(home))
    monkeypatch.setenv("SPECREG_CACHE", os.environ.get("SPECREG_CACHE", str(REPO / ".cache")))
    # The suite shares its host (CI runners, other jobs): a test's measurements take turns
    # through a lock of the test's own and accept their neighbours' load and spread, as a user
    # on a shared host says through these variables. The load guard's own tests
    # (tests/host/test_load*.py) set strict ones.
    monkeypatch.setenv("SPECREG_MEASURE_LOCK", str(tmp_path / "specreg-measure.lock"))
    for name, value in (("SPECREG_MAX_LOAD", "1000"), ("SPECREG_MAX_SPREAD", "1000")):
        if name not in os.environ:
            monkeypatch.setenv(name, value)
    return home


@pytest.fixture(scope="session")
def vocab_dir() -> Path:
    """llama.cpp's real vocab-only GGUFs (models/ggml-vocab-*.gguf of the pinned sdist)."""
    os.environ.setdefault("SPECREG_CACHE", str(REPO / ".cache"))
    from specreg.host.sources import vocab_gguf_paths

    try:
        paths = vocab_gguf_paths()
    except Exception as err:  # noqa: BLE001 - reported through require()
        require(False, f"the pinned llama.cpp sdist ({err})")
        raise
    require(len(paths) >= 15, "llama.cpp's vocab GGUFs")
    return paths[0].parent


@pytest.fixture(scope="session")
def vocab_paths(vocab_dir: Path) -> list[Path]:
    return sorted(vocab_dir.glob("ggml-vocab-*.gguf"))


GGUFFactory = Callable[..., Path]
# A mixture-of-experts model for the factory: `gguf_factory(..., arch="qwen3moe", kv=MOE_KV)`.
MOE_KV = {"qwen3moe.expert_count": 8, "qwen3moe.expert_used_count": 2}


@pytest.fixture
def gguf_factory(tmp_path: Path) -> GGUFFactory:
    """Write a tiny GGUF: `make(name, tokens=[...], kv={...}, arch="llama", tensors=[...])`.

    kv values: bool, int (uint32), float, str, or a list. Keys starting with "tokenizer." are
    written as given; `bos`, `eos`, `add_bos`, `add_eos`, `model`, `pre` are shortcuts.
    """

    def make(
        name: str = "tiny.gguf",
        *,
        tokens: Sequence[str] | None = None,
        token_types: Sequence[int] | None = None,
        model: str | None = "gpt2",
        pre: str | None = "qwen2",
        bos: int | None = None,
        eos: int | None = None,
        add_bos: bool | None = None,
        add_eos: bool | None = None,
        kv: dict[str, Any] | None = None,
        arch: str = "llama",
        general_name: str | None = None,
        tensors: Sequence[tuple[str, tuple[int, ...]]] = (("token_embd.weight", (8, 4)),),
        directory: Path | None = None,
    ) -> Path:
        import numpy as np

        from specreg.samples.demo import add_kv

        path = (directory or tmp_path / "models") / name
        path.parent.mkdir(parents=True, exist_ok=True)
        w = GGUFWriter(path, arch)
        if general_name is not None:
            w.add_name(general_name)
        w.add_block_count(1)
        w.add_context_length(128)
        w.add_embedding_length(4)
        if model is not None:
            w.add_tokenizer_model(model)
        if pre is not None:
            w.add_tokenizer_pre(pre)
        toks = list(tokens) if tokens is not None else [f"t{i}" for i in range(64)]
        if toks:
            w.add_token_list(toks)
            w.add_token_types(list(token_types) if token_types else [1] * len(toks))
        if model in ("gpt2", "gemma4"):
            w.add_token_merges(["t 1"])
        if bos is not None:
            w.add_bos_token_id(bos)
        if eos is not None:
            w.add_eos_token_id(eos)
        if add_bos is not None:
            w.add_add_bos_token(add_bos)
        if add_eos is not None:
            w.add_add_eos_token(add_eos)
        for key, value in (kv or {}).items():
            add_kv(w, key, value)
        for tname, shape in tensors:
            w.add_tensor(tname, np.zeros(shape, dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path

    return make


@pytest.fixture
def tiny_split() -> DemoModel:
    """A tiny Qwen2-shaped model in three split parts (`Tiny-Split-0000N-of-00003.gguf`), to
    write with `write_demo_model`."""
    from specreg.samples.demo import Arch, DemoModel, qwen_vocab

    return DemoModel(
        "Tiny-Split.gguf",
        "Tiny Split",
        Arch("qwen2", 4, 256, 512, 4, 2, 151936),
        qwen_vocab("qwen2.5"),
        n_split=3,
    )


@pytest.fixture(scope="session")
def sparse_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo collection: sparse big models (split 480B MoE, hybrid, MTP, EAGLE-3, ...)."""
    from specreg.samples.demo import make_demo_tree

    root = tmp_path_factory.mktemp("demo-tree")
    make_demo_tree(root)
    return root


@pytest.fixture(scope="session")
def _scanned_db_template(
    tmp_path_factory: pytest.TempPathFactory, sparse_tree: Path, vocab_dir: Path
) -> Path:
    from specreg.registry.db import opened
    from specreg.registry.scan import scan_paths

    db = tmp_path_factory.mktemp("scanned") / "registry.duckdb"
    with opened(db) as con:
        result = scan_paths(con, [sparse_tree, vocab_dir])
    assert result.ok, result.errors
    return db


@pytest.fixture
def scanned_db(_scanned_db_template: Path, tmp_path: Path) -> Iterator[Path]:
    """A private copy of a registry holding the real vocab GGUFs and the demo tree."""
    db = tmp_path / "registry.duckdb"
    shutil.copy(_scanned_db_template, db)
    yield db
