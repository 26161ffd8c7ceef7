"""The builtin agent's transcript: saved atomically and privately, refused in one line."""

import json
import os
import stat
from pathlib import Path

import pytest

import ipc
from child.backends.builtin._transcript import TranscriptError, load_transcript, save_transcript


def test_a_saved_transcript_loads_back_and_is_private(tmp_path: Path):
    path = tmp_path / "transcript.json"
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]
    save_transcript(path, messages)
    save_transcript(path, [*messages, {"role": "assistant", "content": "yo"}])
    assert load_transcript(path)[-1] == {"role": "assistant", "content": "yo"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["transcript.json"]  # no temp file left


def test_a_symlink_planted_at_a_temp_path_is_not_followed(tmp_path: Path):
    tmp_path.chmod(0o700)
    path = tmp_path / "transcript.json"
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    # The temp name has a random part: a guess planted beside it is never written through.
    (tmp_path / f".transcript.json.{os.getpid()}.tmp").symlink_to(target)
    save_transcript(path, [])
    assert target.read_text() == "keep"
    assert not path.is_symlink()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_transcript_outside_a_private_directory_is_refused(tmp_path: Path):
    tmp_path.chmod(0o755)
    with pytest.raises(ipc.LoadoutError, match="must be mode 0700"):
        save_transcript(tmp_path / "transcript.json", [])


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "is gone; the child cannot be revived"),
        (b"{", "is unreadable"),
        (json.dumps({"version": 2, "messages": []}).encode(), "is not a version 1 transcript"),
        (json.dumps({"version": 1, "messages": {}}).encode(), "holds no conversation"),
        (json.dumps({"version": 1, "messages": [{"content": 1}]}).encode(), "no conversation"),
    ],
)
def test_an_unusable_transcript_is_one_line(tmp_path: Path, content, message):
    path = tmp_path / "transcript.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(TranscriptError) as info:
        load_transcript(path)
    assert message in str(info.value)
    assert "\n" not in str(info.value)
