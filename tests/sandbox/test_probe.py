"""probe(): the real launcher, once, with our exact flags — and launchers that must fail it."""

from __future__ import annotations

import re
import shutil
import sys
import tempfile

import pytest

from sandbox import probe
from sandbox._probe import probe_platform


def _fake_bwrap(tmp_path, monkeypatch, body: str) -> None:
    """Put a shell-script ``bwrap`` first and alone on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "bwrap"
    fake.write_text(
        '#!/bin/sh\nif [ "$1" = --version ]; then echo "bubblewrap 9.9.9"; exit 0; fi\n' + body
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))


def test_probe_finds_working_bubblewrap(bwrap_works):
    result = probe()
    assert result.available
    assert result.launcher == "bwrap"
    assert result.reason == ""
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?", result.version)


def test_probe_works_with_a_temporary_directory_outside_tmp(bwrap_works, monkeypatch):
    # Outside /tmp the probe's host file lies on the sandbox's read-only root: the write the
    # self-test expects to fail must not end the shell (a node with TMPDIR=/var/tmp/... would
    # refuse every sandboxed child).
    directory = tempfile.mkdtemp(prefix="fleet-probe-test-", dir="/var/tmp")
    try:
        monkeypatch.setattr(tempfile, "tempdir", directory)
        result = probe_platform("linux")
        assert result.available, result.reason
    finally:
        shutil.rmtree(directory)


def test_probe_is_cached_until_refreshed(bwrap_works):
    first = probe()
    assert probe() is first
    fresh = probe(refresh=True)
    assert fresh is not first
    assert fresh == first


@pytest.mark.skipif(sys.platform != "linux", reason="probes bubblewrap")
def test_missing_bwrap_is_unavailable(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    result = probe_platform("linux")
    assert (result.available, result.launcher) == (False, "bwrap")
    assert result.reason == "bwrap not found on PATH; install bubblewrap"


@pytest.mark.skipif(sys.platform != "linux", reason="probes bubblewrap")
def test_bwrap_that_cannot_create_namespaces_is_unavailable(tmp_path, monkeypatch):
    _fake_bwrap(
        tmp_path,
        monkeypatch,
        'echo "bwrap: setting up uid map: Permission denied" >&2\necho "more detail" >&2\nexit 1\n',
    )
    result = probe_platform("linux")
    assert not result.available
    assert result.version == "9.9.9"
    assert result.reason == (
        "bwrap self-test failed (exit 1): bwrap: setting up uid map: Permission denied"
    )


@pytest.mark.skipif(sys.platform != "linux", reason="probes bubblewrap")
def test_launcher_that_does_not_isolate_is_not_trusted(tmp_path, monkeypatch):
    # Drops every option and runs the command directly: no mount namespace at all. As root the
    # self-test's mkdir in / succeeds (and is removed again); otherwise the write next to
    # scratch reaches the host. Either way the probe must refuse it.
    _fake_bwrap(tmp_path, monkeypatch, 'while [ "$1" != -- ]; do shift; done\nshift\nexec "$@"\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    result = probe_platform("linux")
    assert not result.available
    assert result.reason.endswith("; not trusting it")


@pytest.mark.skipif(sys.platform != "linux", reason="probes bubblewrap")
def test_bwrap_that_ignores_scratch_is_unavailable(tmp_path, monkeypatch):
    _fake_bwrap(tmp_path, monkeypatch, "exit 0\n")
    result = probe_platform("linux")
    assert not result.available
    assert result.reason == "bwrap ran but the scratch dir was not writable inside"


@pytest.mark.skipif(sys.platform == "darwin", reason="macOS has sandbox-exec")
def test_seatbelt_probe_off_macos_is_unavailable():
    result = probe_platform("darwin")
    assert (result.available, result.launcher) == (False, "sandbox-exec")
    assert result.reason == "/usr/bin/sandbox-exec not found; Seatbelt needs macOS"


def test_platform_without_a_launcher_is_unavailable():
    result = probe_platform("sunos5")
    assert (result.available, result.launcher, result.version) == (False, "none", "")
    assert result.reason.startswith("no sandbox launcher for platform 'sunos5'")
