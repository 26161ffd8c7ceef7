"""Deleting a directory a child wrote in: its scratch once it has handed off, a remote child's
node directory once it has ended.

Scratch is the one place every child may write whatever its policy; it holds its backend's
session store, which revive and hibernation need for as long as the child can run again. A
remote child's whole node directory (its checkout, scratch and key) goes when it ends.
"""

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any


def remove_tree(tree: Path | str) -> None:
    """Delete *tree*, a directory a child wrote in (blocking: run it in a thread).

    A child's scratch holds its backend's session store (a Claude Code ``HOME``, a
    ``CODEX_HOME``, a Pi session file, the builtin agent's transcript), of no use once the child
    can never run again and often tens of megabytes. The child may have left directories it made
    unwritable: they are made writable again on the way. ``shutil.rmtree`` does not follow
    symbolic links, so nothing outside *tree* is touched; a *tree* that is itself a link, or is
    missing, is left alone.
    """

    def unlock(func: Any, name: str, _exc: object) -> None:
        for path in (os.path.dirname(name), name):
            with contextlib.suppress(OSError):
                if not os.path.islink(path):  # Linux has no lchmod
                    os.chmod(path, 0o700)
        if func in (os.rmdir, os.unlink, os.remove):  # not os.open or a scan: nothing to retry
            with contextlib.suppress(OSError):
                func(name)

    tree = Path(tree)
    if tree.is_dir() and not tree.is_symlink():
        shutil.rmtree(tree, onerror=unlock)
