"""Readable names for files in a Hugging Face cache.

The hub keeps a file's bytes once, under a content hash (`models--ORG--NAME/blobs/HASH`), and
links every revision's file name to it (`models--ORG--NAME/snapshots/REV/FILE.gguf`). The
registry keys a file by its real path, the blob; people, llama.cpp's split loader and serve's
model ids need the snapshot name, which is what this module finds.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

_REPO_PREFIX = "models--"


def blob_repo(path: str) -> str | None:
    """The repository folder (`.../models--ORG--NAME`) of a blob, None for any other path."""
    parent = os.path.dirname(path)
    repo = os.path.dirname(parent)
    if os.path.basename(parent) == "blobs" and os.path.basename(repo).startswith(_REPO_PREFIX):
        return repo
    return None


def repo_id(path: str) -> str | None:
    """`ORG/NAME` of a path inside a hub cache repository (`models--ORG--NAME/...`), else None."""
    for part in reversed(path.split(os.sep)):
        if part.startswith(_REPO_PREFIX) and len(part) > len(_REPO_PREFIX):
            return part[len(_REPO_PREFIX) :].replace("--", "/")
    return None


def _current_revision(repo: str) -> str | None:
    try:
        with open(os.path.join(repo, "refs", "main"), encoding="utf-8") as f:
            return f.read().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def _snapshot_of(link: str) -> tuple[str, str] | None:
    """(repository folder, revision) of a path under `models--ORG--NAME/snapshots/REV/`."""
    parts = link.split(os.sep)
    for i in range(len(parts) - 2, 0, -1):
        if parts[i] == "snapshots" and parts[i - 1].startswith(_REPO_PREFIX):
            return os.sep.join(parts[:i]), parts[i + 1]
    return None


def _links_on_disk(repo: str, real: str) -> list[str]:
    """The snapshot links that lead to `real`, found by looking (a scan of the blobs alone)."""
    out = []
    for dirpath, _, filenames in os.walk(os.path.join(repo, "snapshots")):
        for name in filenames:
            link = os.path.join(dirpath, name)
            try:
                if os.path.islink(link) and os.path.realpath(link) == real:
                    out.append(link)
            except OSError:
                continue
    return out


def snapshot_name(real: str, links: Iterable[str], *, look: bool = False) -> str | None:
    """The snapshot path a hub blob is known by (the current revision's when several link to
    it), chosen among `links`, or found on disk when `look` and none of them is one; None for a
    file that is not a hub blob, or a blob no snapshot names. `real` is a real path; a link may
    reach the repository through another symlinked folder."""
    repo = blob_repo(real)
    if repo is None:
        return None
    named: list[tuple[str, str]] = []
    for link in links:
        where = _snapshot_of(link)
        if where is not None and (where[0] == repo or os.path.realpath(where[0]) == repo):
            named.append((link, where[1]))
    if not named and look:
        named = [(link, (_snapshot_of(link) or ("", ""))[1]) for link in _links_on_disk(repo, real)]
    if not named:
        return None
    current = _current_revision(repo)
    named.sort(key=lambda lr: (lr[1] != current, lr[0]))
    return named[0][0]
