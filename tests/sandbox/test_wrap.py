"""wrap(): the bubblewrap argv, the environment, command resolution and the fallback."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from sandbox import Policy, ProbeResult, SandboxError, SandboxSpec, wrap
from sandbox._seccomp import nosuid_filter

BWRAP = shutil.which("bwrap")
needs_bwrap = pytest.mark.needs("bwrap")
WORKS = ProbeResult(available=True, launcher="bwrap", reason="", version="0.8.0")
BROKEN = ProbeResult(
    available=False,
    launcher="bwrap",
    reason="bwrap self-test failed (exit 1): bwrap: setting up uid map: Permission denied",
    version="0.8.0",
)
SH = str(Path(os.path.realpath(Path(shutil.which("sh") or "/bin/sh").parent)) / "sh")


def _command(argv: tuple[str, ...]) -> tuple[str, ...]:
    return argv[argv.index("--") + 1 :]


@needs_bwrap
def test_bwrap_argv_has_exactly_the_documented_shape(layout):
    spec = SandboxSpec(
        policy=Policy.WORKER,
        scratch=layout.scratch,
        visible=(layout.repo,),
        writable=(layout.worktree,),
        sockets=(layout.ipc,),
        cwd=layout.worktree,
    )
    wrapped = wrap(["sh", "-c", "true"], spec, probe_result=WORKS)
    repo, scratch, worktree, ipc = (
        str(p.resolve()) for p in (layout.repo, layout.scratch, layout.worktree, layout.ipc)
    )
    # The shell opens the seccomp filter as fd 3 and execs bwrap (which then keeps the pid).
    assert wrapped.argv[:3] == ("/bin/sh", "-c", 'exec "$@" 3<"$0"')
    assert Path(wrapped.argv[3]).read_bytes() == nosuid_filter()
    assert wrapped.argv[4:] == (
        BWRAP,
        "--die-with-parent",
        "--new-session",
        "--unshare-user",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--cap-drop",
        "ALL",
        "--ro-bind", "/", "/",
        "--dev", "/dev",
        "--proc", "/proc",
        "--tmpfs", "/tmp",
        "--ro-bind", repo, repo,
        "--ro-bind", ipc, ipc,
        "--bind", scratch, scratch,
        "--bind", worktree, worktree,
        "--seccomp", "3",
        "--chdir", worktree,
        "--",
        SH, "-c", "true",
    )  # fmt: skip
    assert wrapped.wrapped
    assert wrapped.launcher == "bwrap"
    assert wrapped.reason == ""


@needs_bwrap
def test_tmpfs_comes_before_every_bind_of_a_named_path(layout):
    spec = SandboxSpec(
        policy=Policy.WORKER,
        scratch=layout.scratch,
        visible=(layout.repo,),
        writable=(layout.worktree,),
    )
    argv = wrap(["sh"], spec, probe_result=WORKS).argv
    tmpfs = argv.index("--tmpfs")
    named = {str(p.resolve()) for p in (layout.repo, layout.scratch, layout.worktree)}
    binds = [i for i, arg in enumerate(argv) if arg in named]
    assert len(binds) == 6
    assert min(binds) > tmpfs
    # The root bind is the first mount: later binds must not be shadowed by it.
    assert argv.index("--ro-bind") < argv.index("--dev") < tmpfs


@needs_bwrap
@pytest.mark.parametrize(
    ("policy", "network", "unshared"),
    [
        (Policy.READ_ONLY, None, True),
        (Policy.REVIEW, None, False),
        (Policy.WORKER, None, True),
        (Policy.READ_ONLY, True, False),
        (Policy.REVIEW, False, True),
    ],
)
def test_network_namespace_follows_the_policy_default_and_override(
    layout, policy, network, unshared
):
    spec = SandboxSpec(policy=policy, scratch=layout.scratch, network=network)
    argv = wrap(["sh"], spec, probe_result=WORKS).argv
    assert ("--unshare-net" in argv) is unshared
    assert "--unshare-user" in argv
    assert argv[argv.index("--cap-drop") + 1] == "ALL"


@needs_bwrap
def test_symlinked_paths_are_canonicalized(layout, tmp_path):
    scratch_link = tmp_path / "scratch-link"
    scratch_link.symlink_to(layout.scratch)
    repo_link = tmp_path / "repo-link"
    repo_link.symlink_to(layout.repo)
    spec = SandboxSpec(policy=Policy.READ_ONLY, scratch=scratch_link, visible=(repo_link,))
    wrapped = wrap(["sh"], spec, probe_result=WORKS)
    scratch = str(layout.scratch.resolve())
    repo = str(layout.repo.resolve())
    after_tmpfs = wrapped.argv.index("--tmpfs") + 2
    assert wrapped.argv[after_tmpfs : after_tmpfs + 6] == (
        "--ro-bind", repo, repo, "--bind", scratch, scratch
    )  # fmt: skip
    assert str(scratch_link) not in wrapped.argv
    assert str(repo_link) not in wrapped.argv
    assert wrapped.env["TMPDIR"] == scratch


def test_env_points_temp_and_caches_at_scratch(layout):
    spec = SandboxSpec(policy=Policy.READ_ONLY, scratch=layout.scratch)
    scratch = layout.scratch.resolve()
    for probe_result in (WORKS, BROKEN):
        assert wrap(["sh"], spec, probe_result=probe_result).env == {
            "TMPDIR": str(scratch),
            "TMP": str(scratch),
            "TEMP": str(scratch),
            "XDG_CACHE_HOME": str(scratch / ".cache"),
            "PYTHONPYCACHEPREFIX": str(scratch / ".pycache"),
        }


@needs_bwrap
def test_interpreter_is_absolute_and_keeps_its_venv_name(layout, tmp_path):
    # A venv's bin/python is a symlink; resolving it fully would drop the venv's packages.
    real_bin = tmp_path / "venv" / "bin"
    real_bin.mkdir(parents=True)
    (real_bin / "python").symlink_to(sys.executable)
    linked_bin = tmp_path / "bin-link"
    linked_bin.symlink_to(real_bin)
    spec = SandboxSpec(policy=Policy.READ_ONLY, scratch=layout.scratch, visible=(real_bin,))
    wrapped = wrap([str(linked_bin / "python"), "-V"], spec, probe_result=WORKS)
    assert _command(wrapped.argv) == (str(real_bin.resolve() / "python"), "-V")


@needs_bwrap
def test_bare_command_is_found_on_path(layout):
    spec = SandboxSpec(policy=Policy.READ_ONLY, scratch=layout.scratch)
    assert _command(wrap(["sh", "-c", "exit 0"], spec, probe_result=WORKS).argv) == (
        SH,
        "-c",
        "exit 0",
    )


@needs_bwrap
def test_command_hidden_by_the_tmpfs_is_refused_unless_visible(layout, tmp_path):
    tool = tmp_path / "tools" / "tool"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    spec = SandboxSpec(policy=Policy.READ_ONLY, scratch=layout.scratch)
    with pytest.raises(SandboxError, match="add its directory to visible") as caught:
        wrap([str(tool)], spec, probe_result=WORKS)
    assert caught.value.path == tool.resolve()
    visible = SandboxSpec(policy=Policy.READ_ONLY, scratch=layout.scratch, visible=(tool.parent,))
    assert _command(wrap([str(tool)], visible, probe_result=WORKS).argv) == (str(tool.resolve()),)


def test_unknown_command_and_empty_argv_are_refused(layout):
    spec = SandboxSpec(policy=Policy.READ_ONLY, scratch=layout.scratch)
    with pytest.raises(SandboxError, match="not found on PATH"):
        wrap(["fleet-no-such-command-xyz"], spec, probe_result=WORKS)
    with pytest.raises(SandboxError, match="empty argv"):
        wrap([], spec, probe_result=WORKS)


def test_failed_probe_returns_the_original_argv_unwrapped(layout):
    spec = SandboxSpec(policy=Policy.READ_ONLY, scratch=layout.scratch)
    wrapped = wrap(["fleet-no-such-command-xyz", "arg"], spec, probe_result=BROKEN)
    assert wrapped.argv == ("fleet-no-such-command-xyz", "arg")
    assert not wrapped.wrapped
    assert wrapped.launcher == "none"
    assert wrapped.reason == BROKEN.reason
    assert "\n" not in wrapped.reason


def test_spec_refusals_still_raise_without_a_launcher(layout):
    spec = SandboxSpec(policy=Policy.WORKER, scratch=layout.scratch, writable=(Path.home(),))
    with pytest.raises(SandboxError, match=r"contains \$HOME"):
        wrap(["sh"], spec, probe_result=BROKEN)


def test_platform_without_a_launcher_is_unwrapped(layout):
    spec = SandboxSpec(policy=Policy.READ_ONLY, scratch=layout.scratch)
    wrapped = wrap(["sh"], spec, platform="win32")
    assert (wrapped.wrapped, wrapped.launcher, wrapped.argv) == (False, "none", ("sh",))
    assert "no sandbox launcher for platform 'win32'" in wrapped.reason


def test_probe_result_for_another_launcher_is_unwrapped(layout):
    spec = SandboxSpec(policy=Policy.READ_ONLY, scratch=layout.scratch)
    wrapped = wrap(
        ["sh"],
        spec,
        platform="linux",
        probe_result=WORKS.__class__(
            available=True, launcher="sandbox-exec", reason="", version="14.5"
        ),
    )
    assert not wrapped.wrapped
    assert wrapped.reason == "probe result is for sandbox-exec but platform 'linux' needs bwrap"


@pytest.mark.skipif(sys.platform == "darwin", reason="macOS has sandbox-exec")
def test_macos_command_without_a_probe_result_is_unwrapped_off_macos(layout):
    spec = SandboxSpec(policy=Policy.READ_ONLY, scratch=layout.scratch)
    wrapped = wrap(["sh"], spec, platform="darwin")
    assert not wrapped.wrapped
    assert wrapped.reason == "/usr/bin/sandbox-exec not found; Seatbelt needs macOS"


def test_default_probe_on_this_platform_is_the_cached_probe(layout, bwrap_works):
    spec = SandboxSpec(policy=Policy.READ_ONLY, scratch=layout.scratch)
    wrapped = wrap(["sh"], spec)
    assert wrapped.wrapped
    assert wrapped.launcher == "bwrap"
