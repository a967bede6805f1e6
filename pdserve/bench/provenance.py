"""Which source a results file came from: one answer for every benchmark.

$PDSERVE_COMMIT wins (the GPU machine's copy of the tree may carry a stale .git: its HEAD named
a commit sessions old, so device scripts pass the commit, see bench/gpu_env.sh); else git's
short HEAD, with "+dirty" when tracked source files differ from it; "unknown" without git.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("pdserve", "bench", "gateway", "prefill_service", "decode_service")


def source_commit(root: Path = ROOT) -> str:
    """The commit the benchmark's code is (see the module doc)."""
    if pinned := os.environ.get("PDSERVE_COMMIT", "").strip():
        return pinned
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=root, timeout=10)
        if head.returncode != 0 or not head.stdout.strip():
            return "unknown"
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", *SOURCE_DIRS],
                                 capture_output=True, text=True, cwd=root, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if changed else "")
