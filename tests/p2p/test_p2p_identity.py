"""Identity files: persisted, reloaded to the same peer id, corrupt files rejected; bootstrap list parsing."""

import os
import stat
import subprocess
import sys

import pytest

from p2p.bootstrap import load_bootstrap_file, parse_bootstrap_lines, resolve_bootstrap
from p2p.errors import BootstrapError, IdentityError
from p2p.identity import (
    KEY_FILE_NAME,
    Identity,
    load_or_create_identity,
    public_bytes_from_peer_id,
    read_key_file,
    write_key_file,
)

PEER = "12D3KooWCRdwY7d9wf6inqzAJLp86LghWeBAoQX5Lo6T7T3uXXN7"


def test_identity_persisted_with_mode_0600_and_reloaded_to_same_peer_id(tmp_path):
    first = load_or_create_identity(tmp_path)
    path = tmp_path / KEY_FILE_NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes() == first.seed and len(first.seed) == 32
    again = load_or_create_identity(tmp_path)
    assert again.peer_id == first.peer_id and again.public_bytes == first.public_bytes
    assert load_or_create_identity(tmp_path / "other").peer_id != first.peer_id


def test_peer_id_embeds_the_signing_key():
    ident = Identity(bytes(range(32)))
    assert ident.peer_id.startswith("12D3KooW")
    assert public_bytes_from_peer_id(ident.peer_id) == ident.public_bytes
    assert ident.key_pair.public_key.to_bytes() == ident.public_bytes
    with pytest.raises(IdentityError):
        public_bytes_from_peer_id("not-a-peer-id")


def test_sign_and_verify_reject_tampering():
    ident = Identity.generate()
    sig = ident.sign(b"manifest")
    assert Identity.verify(ident.public_bytes, b"manifest", sig)
    assert not Identity.verify(ident.public_bytes, b"manifesT", sig)
    assert not Identity.verify(Identity.generate().public_bytes, b"manifest", sig)
    assert not Identity.verify(ident.public_bytes, b"manifest", sig[:-1] + bytes([sig[-1] ^ 1]))
    assert not Identity.verify(b"short", b"manifest", sig)


@pytest.mark.parametrize("content", [b"", b"\x00" * 31, b"\x00" * 33, b"\x00" * 64])
def test_wrong_size_key_file_is_a_clear_error(tmp_path, content):
    path = tmp_path / KEY_FILE_NAME
    path.write_bytes(content)
    with pytest.raises(IdentityError, match="corrupt"):
        load_or_create_identity(tmp_path)
    assert path.read_bytes() == content  # never silently replaced by a new key


def test_write_refuses_to_overwrite_and_missing_file_is_named(tmp_path):
    path = tmp_path / "k.key"
    ident = Identity.generate()
    write_key_file(path, ident)
    with pytest.raises(IdentityError, match="refusing to overwrite"):
        write_key_file(path, Identity.generate())
    assert read_key_file(path).seed == ident.seed
    with pytest.raises(IdentityError, match="does not exist"):
        read_key_file(tmp_path / "missing.key")


def test_keygen_cli_writes_key_prints_public_hex_and_refuses_overwrite(tmp_path):
    path = tmp_path / "trainer.key"
    cmd = [sys.executable, "-m", "swarm", "keygen", str(path)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert read_key_file(path).public_bytes.hex() in out
    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode == 2 and "refusing to overwrite" in again.stderr and "Traceback" not in again.stderr
    assert os.path.getsize(path) == 32


def test_bootstrap_lines_skip_comments_and_name_the_bad_line(tmp_path):
    good = f"/ip4/127.0.0.1/tcp/4001/p2p/{PEER}"
    text = f"# known peers\n\n{good}  # trailing comment\n{good}\n"
    assert parse_bootstrap_lines(text.splitlines(), "f") == (good,)
    path = tmp_path / "bootstrap_peers.txt"
    path.write_text(f"# ok\n{good}\n/ip4/999.1.1.1/tcp/1/p2p/{PEER}\n")
    with pytest.raises(BootstrapError, match=r"bootstrap_peers.txt line 3: '/ip4/999"):
        load_bootstrap_file(path)
    with pytest.raises(BootstrapError, match=r"line 1: .*lacks the /p2p/"):
        parse_bootstrap_lines(["/ip4/127.0.0.1/tcp/4001"], "--bootstrap")


def test_bootstrap_precedence_flag_then_config_then_file(tmp_path):
    path = tmp_path / "bootstrap_peers.txt"
    from_file = f"/ip4/10.0.0.1/tcp/1/p2p/{PEER}"
    path.write_text(from_file + "\n")
    flag, conf = f"/ip4/10.0.0.2/tcp/1/p2p/{PEER}", f"/ip4/10.0.0.3/tcp/1/p2p/{PEER}"
    assert resolve_bootstrap([flag], [conf], path) == (flag,)
    assert resolve_bootstrap(None, [conf], path) == (conf,)
    assert resolve_bootstrap(None, None, path) == (from_file,)
    assert resolve_bootstrap(None, None, tmp_path / "absent.txt") == ()


def test_an_identity_derives_its_keys_once_and_stays_a_plain_picklable_value():
    import pickle

    from p2p import identity as module

    ident = Identity.generate()
    first = ident.peer_id
    calls_before = module._public_bytes.cache_info().misses
    assert [ident.peer_id, Identity(ident.seed).peer_id] == [first, first]
    assert module._public_bytes.cache_info().misses == calls_before  # no scalar multiplication again
    copy = pickle.loads(pickle.dumps(ident))
    assert copy == ident and copy.peer_id == first
    assert Identity.verify(ident.public_bytes, b"data", copy.sign(b"data"))
