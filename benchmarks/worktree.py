"""Worktree snapshot + create against plain ``git worktree add --detach``, and a 200-file finalize.

Generates a repository of 10 000 files in nested directories (mostly 1-20 KB of text), commits
it, then leaves 50 tracked files modified and 20 untracked. Each repetition times
``create_worktree`` (snapshot commit + detached worktree) and ``git worktree add --detach`` on the
same repository, alternating so both see the same machine; the ratio of the medians is the figure
(target <= 1.5, stretch <= 1.2). Then a worktree gets 200 changed files (modified, added,
deleted, +x) and ``finalize`` copies them back.

Usage: ``.venv/bin/python benchmarks/worktree.py [--files N] [--reps N] [--dir DIR]``. The last
line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from orchestrator.workspace._copyback import finalize
from orchestrator.workspace._review import ReviewStore
from orchestrator.workspace._worktree import create_worktree, remove_worktree

_ENV = os.environ | {
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@example.com",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@example.com",
}


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, env=_ENV, check=True, capture_output=True)


def corpus(rng: random.Random) -> bytes:
    """About 2 MB of code-like lines that files are cut from."""
    words = [
        "".join(rng.choices("abcdefghijklmnopqrstuvwxyz_", k=rng.randint(2, 10)))
        for _ in range(3000)
    ]
    lines = []
    for _ in range(40_000):
        indent = " " * 4 * rng.randint(0, 3)
        lines.append(indent + " ".join(rng.choices(words, k=rng.randint(2, 10))) + "\n")
    return "".join(lines).encode()


def file_size(rng: random.Random) -> int:
    roll = rng.random()
    if roll < 0.08:
        return rng.randint(40, 1000)
    if roll < 0.98:
        return rng.randint(1000, 20_000)
    return rng.randint(20_000, 100_000)


def generate(root: Path, files: int, rng: random.Random) -> list[str]:
    text = corpus(rng)
    paths = []
    for i in range(files):
        rel = f"pkg{i % 16}/mod{(i // 16) % 24}/part{(i // 384) % 5}/file{i}.py"
        start = rng.randrange(len(text) - 100_000)
        data = f"# file {i}\n".encode() + text[start : start + file_size(rng)]
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        paths.append(rel)
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "generated")
    return paths


def dirty(root: Path, paths: list[str], rng: random.Random) -> None:
    for rel in rng.sample(paths, 50):
        with (root / rel).open("ab") as f:
            f.write(b"# locally modified\n")
    for i in range(20):
        (root / f"pkg{i % 16}" / f"untracked{i}.py").write_text(f"untracked = {i}\n")


def time_creates(root: Path, scratch: Path, reps: int) -> tuple[list[float], list[float]]:
    plain, ours = [], []
    for rep in range(reps):
        dest = scratch / f"plain{rep}"
        start = time.perf_counter()
        git(root, "worktree", "add", "-q", "--detach", str(dest))
        plain.append(time.perf_counter() - start)
        git(root, "worktree", "remove", "--force", str(dest))
        start = time.perf_counter()
        snapshot = create_worktree(root, scratch / f"ours{rep}")
        ours.append(time.perf_counter() - start)
        remove_worktree(snapshot)
    return plain, ours


def time_finalize(
    root: Path, scratch: Path, paths: list[str], rng: random.Random, scale: int = 10
) -> float:
    """Copy back ``20 * scale`` changed files (by default 200): 70 % edited, 10 % deleted,
    5 % made executable, 15 % new."""
    snapshot = create_worktree(root, scratch / "finalize")
    wt = snapshot.worktree
    edited, deleted, chmodded, added = 14 * scale, 2 * scale, scale, 3 * scale
    chosen = rng.sample(paths, edited + deleted + chmodded)
    for rel in chosen[:edited]:
        with (wt / rel).open("ab") as f:
            f.write(b"# changed by the child\n")
    for rel in chosen[edited : edited + deleted]:
        (wt / rel).unlink()
    for rel in chosen[edited + deleted :]:
        (wt / rel).chmod(0o755)
    new = [f"added/dir{i % 3}/new{i}.py" for i in range(added)]
    for i, rel in enumerate(new):
        (wt / rel).parent.mkdir(parents=True, exist_ok=True)
        (wt / rel).write_text(f"new = {i}\n" * 200)
    store = ReviewStore(scratch / "review")
    start = time.perf_counter()
    # Every path named, as a person landing the whole change does: a file made executable is
    # held otherwise (copy-back quarantine), and all 200 are the work measured.
    result = finalize(snapshot, store, "bench", names=[*chosen, *new])
    elapsed = time.perf_counter() - start
    assert result.error == "", result.error
    assert len(result.applied) == 20 * scale, len(result.applied)
    remove_worktree(snapshot)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to build (default: a temp dir)"
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a tiny run that checks the script works (its figures mean nothing)",
    )
    args = parser.parse_args()
    scale = 10  # 200 changed files copied back
    if args.smoke:
        args.files, args.reps, scale = 100, 1, 1
    rng = random.Random(20240501)  # noqa: S311 - a reproducible workload, not a secret
    base = Path(tempfile.mkdtemp(prefix="fleet-bench-", dir=args.dir))
    try:
        root = base / "repo"
        root.mkdir()
        paths = generate(root, args.files, rng)
        dirty(root, paths, rng)
        plain, ours = time_creates(root, base, args.reps)
        finalize_s = time_finalize(root, base, paths, rng, scale)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    ratio = statistics.median(ours) / statistics.median(plain)
    print(f"worktree benchmark: {args.files} files, 50 dirty + 20 untracked, {args.reps} reps")
    print(f"{'measure':<36} {'median s':>9} {'min s':>7} {'max s':>7}")
    for name, runs in (("git worktree add --detach", plain), ("snapshot + create_worktree", ours)):
        print(f"{name:<36} {statistics.median(runs):>9.3f} {min(runs):>7.3f} {max(runs):>7.3f}")
    print(f"{'create ratio (median / median)':<36} {ratio:>9.2f}")
    print(f"{f'finalize {20 * scale} changed files':<36} {finalize_s:>9.3f}")
    print(
        json.dumps(
            {
                "benchmark": "worktree",
                "create_ratio": round(ratio, 3),
                "finalize_200_s": round(finalize_s, 3),
                "target": 1.5,
            }
        )
    )


if __name__ == "__main__":
    main()
