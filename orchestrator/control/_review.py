"""Control ops for reviewing and landing children's changes: ``diff``, ``accept``, ``revert``
and ``apply``.

``diff`` shows both kinds of change: files a copy-back already applied (their pre-images are in
the review store) and a worker's change still in its worktree (live, idle, held by
``stop --hold``, or with held files), as ``git apply``-able patches marked ``pending`` and, for
a file that runs later or instructs an agent, ``held`` with why. ``apply`` lands a kept change:
its ordinary files, or exactly the paths it names (the only way a held file lands).

Targets are agents (key or name) or paths as the user typed them, made absolute against the
caller's ``cwd``; a target that names nothing is a usage error (exit 2). The work is blocking
file I/O and Git; it runs in worker threads.
"""

import posixpath
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import trio

from orchestrator._errors import FleetError, NotFound, Refused, UsageError
from orchestrator.control._args import str_arg, strs_arg
from orchestrator.core._isolation import apply_settlement
from orchestrator.core._supervisor import Supervisor


def _absolute(base: str, path: str) -> str:
    """*path* as the user typed it, made absolute against *base* (no file is looked at)."""
    return posixpath.normpath(posixpath.join(base, path))


def _under(path: str, target: str) -> bool:
    return path == target or path.startswith(target.rstrip("/") + "/")


class _Targets:
    """A request's targets split into agent keys and absolute paths."""

    def __init__(self, sup: Supervisor, args: Mapping[str, Any], op: str) -> None:
        cwd = args.get("cwd")
        if cwd is not None and (not isinstance(cwd, str) or not cwd.startswith("/")):
            raise UsageError(f"{op}: cwd must be an absolute path")
        self.keys: list[str] = []
        self.paths: list[str] = []
        for ref in strs_arg(args, "targets"):
            try:
                self.keys.append(sup.registry.find(ref).key)
                continue
            except FleetError:
                if ref in sup.worktrees.snapshots:
                    self.keys.append(ref)
                    continue
            self.paths.append(_absolute(cwd or str(sup.config.workspace), ref))

    @property
    def selector(self) -> list[str]:
        """The review store's selector: paths narrow a named child to those paths."""
        return self.paths or self.keys

    @property
    def empty(self) -> bool:
        return not (self.keys or self.paths)


def _unmatched(targets: _Targets, files: list[dict[str, Any]], op: str) -> None:
    """Exit 2 for a path target that names no file in the answer."""
    for path in targets.paths:
        if not any(
            f["path"] == path or f["path"].startswith(path.rstrip("/") + "/") for f in files
        ):
            raise NotFound(
                f"{op}: no child's change at {path} (fleet diff lists changes; a child is named "
                "by its key, such as a1)"
            )


def _relative(sup: Supervisor, path: str) -> str | None:
    try:
        return Path(path).relative_to(sup.config.workspace).as_posix()
    except ValueError:
        return None


async def _worktree_files(sup: Supervisor, targets: _Targets) -> list[dict[str, Any]]:
    """The pending (not yet landed) changes of the selected children's worktrees (every
    worktree when no child is named); Git's patches keep three lines of context."""
    files: list[dict[str, Any]] = []
    for key in targets.keys or list(sup.worktrees.snapshots):
        if key not in sup.worktrees.snapshots:
            continue
        for pending, patch in await sup.worktrees.change(key, []):
            if pending.landed:
                continue
            absolute = str(sup.config.workspace / pending.path)
            if targets.paths and not any(_under(absolute, p) for p in targets.paths):
                continue
            files.append(
                {
                    "path": absolute,
                    "owner": key,
                    "status": pending.delta.status,
                    "diff": patch,
                    "pending": True,
                    "held": pending.why,
                }
            )
    return files


async def review_diff(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    context = args.get("context", 3)
    if not isinstance(context, int) or isinstance(context, bool) or context < 0:
        raise UsageError("diff: --context must be a whole number >= 0")
    targets = _Targets(sup, args, "diff")
    diffs = await trio.to_thread.run_sync(lambda: sup.review.diff(targets.selector, context))
    files = [
        {"path": d.path, "owner": d.owner, "status": d.status, "diff": d.diff, "pending": False}
        for d in diffs
        if not (targets.keys and targets.paths) or d.owner in targets.keys
    ]
    files += await _worktree_files(sup, targets)
    _unmatched(targets, files, "diff")
    return {"files": files}


async def review_accept(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    targets = _Targets(sup, args, "accept")
    accepted = await trio.to_thread.run_sync(lambda: sup.review.accept(targets.selector))
    files = [{"path": path, "status": "accepted"} for path in accepted]
    _unmatched(targets, files, "accept")
    return {"files": files}


async def review_revert(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    targets = _Targets(sup, args, "revert")
    result = await trio.to_thread.run_sync(lambda: sup.review.revert(targets.selector))
    files = [{"path": path, "status": "reverted"} for path in result.reverted]
    files += [{"path": c.path, "status": "failed", "error": c.reason} for c in result.failed]
    _unmatched(targets, files, "revert")
    return {"files": files}


async def review_apply(sup: Supervisor, args: Mapping[str, Any]) -> dict[str, Any]:
    """``fleet apply AGENT [PATH…]``: land a kept change (see the module doc)."""
    ref = str_arg(args, "agent")
    record = sup.registry.find(ref)
    key = record.key
    if key in sup.runs or sup.hibernation.asleep(key):
        raise Refused(
            f"apply: {key} is still running; fleet stop {key} --hold keeps its change for "
            f"review, then fleet apply {key} lands it"
        )
    if key not in sup.worktrees.snapshots:
        raise NotFound(f"apply: {key} has no kept change (its worktree is resolved or gone)")
    cwd = args.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or not cwd.startswith("/")):
        raise UsageError("apply: cwd must be an absolute path")
    names = []
    for path in strs_arg(args, "paths"):
        relative = _relative(sup, _absolute(cwd or str(sup.config.workspace), path))
        if relative is None or relative in {"", "."}:
            raise UsageError(f"apply: {path} is not a file in {sup.config.workspace}")
        names.append(relative)
    fields = await sup.worktrees.apply(key, names or None)
    apply_settlement(record, fields)
    return {"handoffs": [record.handoff()]}
