"""A child's scratch directory, deleted once the child has handed off.

Scratch is the one place every child may write whatever its policy; it holds its backend's
session store, which revive and hibernation need for as long as the child can run again.
"""

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any


def remove_scratch(scratch: Path) -> None:
    """Delete a child's scratch directory once it has handed off (blocking: run it in a thread).

    Its backend's session store lives there (a Claude Code ``HOME``, a ``CODEX_HOME``, a Pi
    session file, the builtin agent's transcript), of no use once the child can never run again
    and often tens of megabytes. The child may have left directories it made unwritable;
    ``shutil.rmtree`` does not follow symbolic links, so nothing outside *scratch* is touched.
    """

    def unlock(func: Any, name: str, _exc: object) -> None:
        for path in (os.path.dirname(name), name):
            with contextlib.suppress(OSError):
                if not os.path.islink(path):  # Linux has no lchmod
                    os.chmod(path, 0o700)
        with contextlib.suppress(OSError):
            func(name)

    if scratch.is_dir() and not scratch.is_symlink():
        shutil.rmtree(scratch, onerror=unlock)
