"""The macOS Seatbelt profile and sandbox-exec argv, built on Linux and checked as text."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import NamedTuple

import pytest

from sandbox import Policy, ProbeResult, SandboxSpec, wrap
from sandbox._seatbelt import path_forms

SEATBELT = ProbeResult(available=True, launcher="sandbox-exec", reason="", version="14.5")


def _twin(path: Path) -> str:
    return "/private" + str(path) if str(path).startswith("/tmp/") else str(path)[len("/private") :]


def _macos(spec: SandboxSpec, argv=("/bin/sh", "-c", "true")) -> tuple[str, ...]:
    wrapped = wrap(list(argv), spec, platform="darwin", probe_result=SEATBELT)
    assert wrapped.wrapped
    assert wrapped.launcher == "sandbox-exec"
    return wrapped.argv


def _split(argv: tuple[str, ...]) -> tuple[str, dict[str, str], tuple[str, ...]]:
    """(profile, -D parameters, command) of a sandbox-exec argv, checking its frame."""
    assert argv[:2] == ("/usr/bin/sandbox-exec", "-p")
    end = argv.index("--")
    params = dict(arg[2:].split("=", 1) for arg in argv[3:end])
    assert all(arg.startswith("-D") for arg in argv[3:end])
    return argv[2], params, argv[end + 1 :]


def _balanced(profile: str) -> bool:
    """Parentheses balance once comments and string literals are removed."""
    code = re.sub(r'"(?:[^"\\]|\\.)*"', '""', re.sub(r";[^\n]*", "", profile))
    depth = 0
    for char in code:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


def _rules(profile: str, operation: str) -> list[str]:
    """The top-level forms of ``profile`` that start with ``(allow OPERATION``."""
    forms = re.findall(r"^\((?:allow|deny) [^\n]*(?:\n  [^\n]*)*", profile, re.MULTILINE)
    return [form for form in forms if re.split(r"[\s)]", form)[1] == operation]


class Case(NamedTuple):
    policy: Policy
    network: bool | None  # the spec's override
    extra_writes: frozenset[str]  # write parameters beyond SCRATCH
    socket_rules: bool  # network denied: only the named Unix sockets are reachable
    net: bool  # a bare (allow network-outbound)


WORKTREE = frozenset({"WORKTREE_0", "WORKTREE_0_ALIAS"})
NONE: frozenset[str] = frozenset()
CASES = {
    "read_only": Case(
        Policy.READ_ONLY, network=None, extra_writes=NONE, socket_rules=True, net=False
    ),
    "review": Case(Policy.REVIEW, network=None, extra_writes=NONE, socket_rules=False, net=True),
    "worker": Case(
        Policy.WORKER, network=None, extra_writes=WORKTREE, socket_rules=True, net=False
    ),
    "read_only+network": Case(
        Policy.READ_ONLY, network=True, extra_writes=NONE, socket_rules=False, net=True
    ),
    "review-network": Case(
        Policy.REVIEW, network=False, extra_writes=NONE, socket_rules=True, net=False
    ),
    "worker+network": Case(
        Policy.WORKER, network=True, extra_writes=WORKTREE, socket_rules=False, net=True
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_profile_per_policy(layout, case):
    policy, network, extra_writes, socket_rules, net = case
    spec = SandboxSpec(
        policy=policy,
        scratch=layout.scratch,
        visible=(layout.repo,),
        writable=(layout.worktree,) if policy is Policy.WORKER else (),
        sockets=(layout.ipc,),
        network=network,
    )
    profile, params, command = _split(_macos(spec))
    assert command == (str(Path(os.path.realpath("/bin")) / "sh"), "-c", "true")
    assert profile.startswith("(version 1)\n(deny default)\n")
    assert _balanced(profile)
    for always in (
        "(allow process-exec)",
        "(allow process-fork)",
        "(allow signal (target same-sandbox))",
        "(allow process-info* (target same-sandbox))",
        "(allow file-read*)",
        "(allow sysctl-read)",
        '(allow file-write* file-ioctl (literal "/dev/null") (literal "/dev/tty"))',
    ):
        assert always in profile.splitlines()
    assert any(
        "com.apple.system.opendirectoryd.libinfo" in r for r in _rules(profile, "mach-lookup")
    )

    writes = {"SCRATCH", "SCRATCH_ALIAS", *extra_writes}
    [write_rule] = [r for r in _rules(profile, "file-write*") if "param" in r]
    assert set(re.findall(r'\(subpath \(param "(\w+)"\)\)', write_rule)) == writes
    scratch = layout.scratch.resolve()
    assert params["SCRATCH"] == str(scratch)
    assert params["SCRATCH_ALIAS"] == _twin(scratch)
    if extra_writes:
        assert params["WORKTREE_0"] == str(layout.worktree.resolve())
        assert params["WORKTREE_0_ALIAS"] == _twin(layout.worktree.resolve())
    # The repository and $HOME never appear in a write rule or parameter.
    assert str(layout.repo.resolve()) not in params.values()
    assert str(Path.home()) not in params.values()

    outbound = _rules(profile, "network-outbound")
    assert ("(allow network-outbound)" in outbound) is net
    if socket_rules:
        assert outbound == [
            (
                "(allow network-outbound\n"
                '  (remote unix-socket (subpath (param "SOCKET_0")))\n'
                '  (remote unix-socket (subpath (param "SOCKET_0_ALIAS"))))'
            )
        ]
        assert "(allow system-socket (socket-domain AF_UNIX))" in profile
        assert params["SOCKET_0"] == str(layout.ipc.resolve())
        assert params["SOCKET_0_ALIAS"] == _twin(layout.ipc.resolve())
    else:
        assert "unix-socket" not in profile
        assert "SOCKET_0" not in params
    assert set(params) == writes | ({"SOCKET_0", "SOCKET_0_ALIAS"} if socket_rules else set())


def test_socket_file_is_matched_exactly_and_a_dir_as_subpath(layout):
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(layout.ipc / "s"))
        spec = SandboxSpec(
            policy=Policy.READ_ONLY, scratch=layout.scratch, sockets=(layout.ipc / "s", layout.repo)
        )
        profile, params, _ = _split(_macos(spec))
    assert '(remote unix-socket (path-literal (param "SOCKET_0")))' in profile
    assert '(remote unix-socket (subpath (param "SOCKET_1")))' in profile
    assert params["SOCKET_0"] == str((layout.ipc / "s").resolve())


def test_hostile_path_text_never_enters_the_profile(tmp_path, layout):
    hostile = tmp_path / 'we"ird\\ (allow default)\n)'
    hostile.mkdir()
    plain = SandboxSpec(policy=Policy.READ_ONLY, scratch=layout.scratch)
    spec = SandboxSpec(policy=Policy.READ_ONLY, scratch=hostile)
    profile, params, _ = _split(_macos(spec))
    assert profile == _split(_macos(plain))[0]
    assert "we" not in profile
    assert "(allow default)" not in profile
    assert params["SCRATCH"] == str(hostile.resolve())
    assert f"-DSCRATCH={hostile.resolve()}" in _macos(spec)


def test_profile_is_deterministic(layout):
    spec = SandboxSpec(policy=Policy.WORKER, scratch=layout.scratch, writable=(layout.worktree,))
    assert _macos(spec) == _macos(spec)


def test_command_is_resolved_and_follows_the_double_dash(layout):
    spec = SandboxSpec(policy=Policy.READ_ONLY, scratch=layout.scratch)
    argv = _macos(spec, argv=("sh", "-c", "echo hi"))
    command = argv[argv.index("--") + 1 :]
    assert Path(command[0]).is_absolute()
    assert Path(command[0]).name == "sh"
    assert command[1:] == ("-c", "echo hi")


@pytest.mark.parametrize(
    ("path", "forms"),
    [
        ("/private/var/folders/x", ("/private/var/folders/x", "/var/folders/x")),
        ("/var/folders/x", ("/var/folders/x", "/private/var/folders/x")),
        ("/tmp", ("/tmp", "/private/tmp")),
        ("/private/tmp/s", ("/private/tmp/s", "/tmp/s")),
        ("/private/etc/hosts", ("/private/etc/hosts", "/etc/hosts")),
        ("/Users/me/repo", ("/Users/me/repo",)),
        ("/variable/x", ("/variable/x",)),
        ("/private/other", ("/private/other",)),
    ],
)
def test_path_forms_pair_private_and_public_spellings(path, forms):
    assert path_forms(Path(path)) == forms
