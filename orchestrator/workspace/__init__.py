"""The workspace: a worker's isolated copy of the repository, and its safe way back.

Owns the plumbing-only snapshot and detached worktrees (``_worktree``, ``_git``), the changed
set (``_changes``), the path guard (``_pathguard``), which changed paths are held for a person's
say (``_quarantine``), the all-or-restore copy-back (``_copyback`` plans it, ``_apply`` performs
its file operations), a kept change as a ``git apply``-able patch (``_patch``), workspaces that
travel as bundles (``_bundle``) and the pre-images kept for ``fleet diff`` and ``fleet revert``
(``_review``).

Imports: the foundation (``orchestrator._errors``, ``_config``, ``_records``, ``_sync``) only;
the core binds runs to worktrees (``core._isolation``).
"""
