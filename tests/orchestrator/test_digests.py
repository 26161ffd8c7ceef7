"""The start-setting digests' HMAC and SHA-256 without hashlib, against hashlib's and hmac's."""

import hashlib
import hmac
import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from orchestrator._digests import keyed_digest, sha256


@given(secret=st.binary(max_size=200), message=st.binary(max_size=300))
def test_the_keyed_digest_is_hmac_sha256(secret, message):
    assert keyed_digest(secret, message) == hmac.new(secret, message, hashlib.sha256).hexdigest()


@given(data=st.binary(max_size=300))
def test_sha256_is_hashlibs(data):
    assert sha256(data).hexdigest() == hashlib.sha256(data).hexdigest()


def test_the_digests_load_neither_hashlib_nor_openssl():
    code = (
        "import sys; from orchestrator._digests import start_digests; "
        "import types; start_digests(types.SimpleNamespace(sandbox='auto', allow_unsandboxed=0, "
        "model='', surface='', idle_timeout_ms=1, max_total_ms=1, fork_server=1, reject_log=0, "
        "egress=(), idle_exit_s=1.0), {}, 'k'); "
        "print(sorted({'hashlib', '_hashlib', 'hmac', 'typing'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
