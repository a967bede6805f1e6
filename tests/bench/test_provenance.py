"""source_commit: the pinned commit first, else git's HEAD marked dirty when sources changed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pdserve.bench.provenance import source_commit

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout.strip()


def test_head_then_dirty_then_pinned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PDSERVE_COMMIT", raising=False)
    (tmp_path / "pdserve").mkdir()
    src = tmp_path / "pdserve" / "a.py"
    src.write_text("x = 1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = _git(tmp_path, "rev-parse", "--short", "HEAD")
    assert source_commit(tmp_path) == head
    (tmp_path / "notes.txt").write_text("untracked files outside the sources do not count\n")
    assert source_commit(tmp_path) == head
    src.write_text("x = 2\n")
    assert source_commit(tmp_path) == head + "+dirty"
    monkeypatch.setenv("PDSERVE_COMMIT", "abc1234")
    assert source_commit(tmp_path) == "abc1234"


def test_no_repository_is_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PDSERVE_COMMIT", raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert source_commit(tmp_path) == "unknown"
