"""Removing a remote child's node directory after its actor was lost while its node lives on.

A child's actor removes the child's node directory when the child ends (:mod:`._ray_node`). An actor
that is itself lost — the OOM killer, a ``ray.kill`` behind our back — cannot: its child dies with
it (``PR_SET_PDEATHSIG``), but the directory (the checkout, the scratch, the node's copy of what the
child wrote) would stay in the node's root of them (``_nodeplan.node_root``). The supervisor then
sends one small task pinned to that node (``NodeAffinitySchedulingStrategy``, not soft) to remove
it. On a node that is gone too the task cannot be placed, and it says why in one line.
"""

import os
import stat
from typing import Any

from orchestrator._trees import remove_tree
from orchestrator.launch._nodeplan import NODE_PREFIX, node_roots
from orchestrator.launch._ray_node import ray_module

__all__ = ["remove_node_directory", "sweep_on_node"]

_task: Any = None


def remove_node_directory(directory: str) -> str:
    """On the node: remove *directory* if it is a node directory of ours; ``""`` when it is
    gone (or never was), else why it was left alone."""
    roots = node_roots()
    if (
        not os.path.isabs(directory)
        or os.path.dirname(directory) not in roots
        or not os.path.basename(directory).startswith(NODE_PREFIX)
    ):
        return f"{directory!r} is not a node directory in {' or '.join(roots)}"
    try:
        info = os.lstat(directory)
    except FileNotFoundError:
        return ""
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        return f"{directory!r} is not a directory of ours"
    remove_tree(directory)
    return "" if not os.path.lexists(directory) else f"{directory!r} could not all be removed"


def sweep_on_node(node_id: str, directory: str, *, timeout: float = 60.0) -> str:
    """Remove *directory* on the node *node_id* (blocking: call it from a worker thread);
    ``""`` when it is gone, else why not (its node is gone too, or it was no node directory)."""
    global _task  # noqa: PLW0603 - ray.remote once per process
    ray = ray_module()
    from ray.util.scheduling_strategies import (  # noqa: PLC0415 - the optional extra
        NodeAffinitySchedulingStrategy,
    )

    if _task is None:
        _task = ray.remote(num_cpus=0, max_retries=0)(remove_node_directory)
    pinned = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    try:
        ref = _task.options(scheduling_strategy=pinned).remote(directory)
        return str(ray.get(ref, timeout=timeout))
    except Exception as exc:  # the node is gone, or never answered
        return f"its node did not remove it ({type(exc).__name__})"
