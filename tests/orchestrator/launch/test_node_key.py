"""A remote child's key and CSR, made in its node's host (``orchestrator.launch._node_key``)."""

import os
import stat

import pytest
from cryptography import x509

from orchestrator.launch._node_key import make_node_key
from orchestrator.remote._ca import SessionCA, owner_of


def test_the_key_stays_in_a_new_private_directory_and_the_ca_signs_the_csr(tmp_path):
    directory = tmp_path / "tls"
    csr = make_node_key(str(directory), "s1", "a7")
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    key = directory / "key.pem"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert b"PRIVATE KEY" in key.read_bytes()
    assert b"PRIVATE" not in csr
    ca = SessionCA("s1")
    leaf = x509.load_pem_x509_certificate(ca.sign(csr, "a7"))
    assert owner_of(leaf, "s1") == "a7"


def test_a_planted_directory_or_link_is_refused_and_not_written_through(tmp_path):
    planted = tmp_path / "planted"
    planted.mkdir()
    with pytest.raises(FileExistsError):
        make_node_key(str(planted), "s1", "a1")
    assert list(planted.iterdir()) == []
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, tmp_path / "link")
    with pytest.raises(FileExistsError):
        make_node_key(str(tmp_path / "link"), "s1", "a1")
    assert list(elsewhere.iterdir()) == []


def test_each_child_gets_a_key_of_its_own(tmp_path):
    first = make_node_key(str(tmp_path / "one"), "s1", "a1")
    second = make_node_key(str(tmp_path / "two"), "s1", "a1")
    assert first != second
    assert (tmp_path / "one" / "key.pem").read_bytes() != (
        tmp_path / "two" / "key.pem"
    ).read_bytes()
