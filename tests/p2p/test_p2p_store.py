"""Piece store: resume after restart, GC of old versions, the data-dir lock, full disk, byte-identical reassembly."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

from p2p.errors import DiskFullError, PieceVerifyError, StoreError, StoreLockedError
from p2p.pieces import store as store_mod
from p2p.pieces.manifest import sign_manifest
from p2p.pieces.store import PieceStore
from tests.p2p.test_p2p_manifest import build, keypair, make_policy


@pytest.fixture
def policy(tmp_path):
    src = tmp_path / "src"
    tensors = make_policy(src, sizes=(400_000, 90_000))
    return src, build(src), tensors


def fill(store, manifest, src, indices):
    for i in indices:
        ref = manifest.pieces[i]
        data = (src / ref.file.name).read_bytes()[ref.offset : ref.offset + ref.length]
        store.write_piece(manifest, i, data)


def test_download_then_reassemble_is_byte_identical_and_loads(tmp_path, policy):
    src, m, tensors = policy
    with PieceStore(tmp_path / "data") as st:
        st.add_manifest(m)
        assert not any(st.bitfield(m))
        fill(st, m, src, reversed(range(m.num_pieces)))  # order must not matter
        assert st.is_complete(m)
        out = st.reassemble(m, tmp_path / "out")
    for f in m.files:
        assert (out / f.name).read_bytes() == (src / f.name).read_bytes()
    loaded = {}
    for f in m.files:
        loaded.update(load_file(str(out / f.name)))
    assert set(loaded) == set(tensors) and all(np.array_equal(loaded[k], tensors[k]) for k in tensors)
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temp file left behind


def test_partial_download_resumes_after_restart_without_refetching(tmp_path, policy):
    src, m, _ = policy
    half = list(range(0, m.num_pieces, 2))
    with PieceStore(tmp_path / "data") as st:
        st.add_manifest(m)
        fill(st, m, src, half)
    with PieceStore(tmp_path / "data") as st:  # a new process: manifests and pieces come back from disk
        assert st.manifest(m.id) == m
        assert [i for i, b in enumerate(st.bitfield(m)) if b] == half
        fill(st, m, src, [i for i in range(m.num_pieces) if i not in half])
        assert st.is_complete(m)


def test_a_piece_corrupted_on_disk_is_fetched_again_after_restart(tmp_path, policy):
    src, m, _ = policy
    with PieceStore(tmp_path / "data") as st:
        st.add_manifest(m)
        fill(st, m, src, [0, 1])
    part = tmp_path / "data" / "files" / f"{m.files[0].root.hex()}.part"
    with open(part, "r+b") as fh:
        fh.seek(10)
        fh.write(b"\xff\xfe")
    with PieceStore(tmp_path / "data") as st:
        assert list(st.bitfield(m)[:3]) == [0, 1, 0]


def test_bad_piece_is_refused_and_not_recorded(tmp_path, policy):
    _, m, _ = policy
    with PieceStore(tmp_path / "data") as st:
        st.add_manifest(m)
        with pytest.raises(PieceVerifyError):
            st.write_piece(m, 0, b"\x00" * m.pieces[0].length)
        assert not st.has_piece(m, 0)


def test_local_policy_is_served_from_the_original_files_without_copying(tmp_path, policy):
    src, m, _ = policy
    with PieceStore(tmp_path / "data") as st:
        st.add_local_policy(m, src)
        assert st.is_complete(m)
        ref = m.pieces[-1]
        assert st.read_piece(m, ref.index) == (src / ref.file.name).read_bytes()[ref.offset :]
    assert not list((tmp_path / "data" / "files").iterdir())
    with PieceStore(tmp_path / "data") as st:  # still served in place after a restart
        assert st.is_complete(m)


def test_gc_keeps_the_newest_versions_and_frees_their_files(tmp_path):
    versions = []
    for v in range(4):
        make_policy(tmp_path / f"v{v}", seed=v, sizes=(70_000,))
        versions.append(build(tmp_path / f"v{v}", version=v))
    with PieceStore(tmp_path / "data", keep_versions=2) as st:
        for v, m in enumerate(versions):
            st.add_manifest(m)
            fill(st, m, tmp_path / f"v{v}", range(m.num_pieces))
        dropped = st.gc()
        assert [m.version for m in dropped] == [0, 1]
        assert [m.version for m in st.manifests()] == [2, 3]
    names = {p.name for p in (tmp_path / "data" / "files").iterdir()}
    assert names == {f"{m.files[0].root.hex()}.data" for m in versions[2:]}
    with PieceStore(tmp_path / "data") as st:
        assert [m.version for m in st.manifests()] == [2, 3]


def test_gc_never_deletes_a_trainers_original_files(tmp_path, policy):
    src, m, _ = policy
    with PieceStore(tmp_path / "data", keep_versions=0) as st:
        st.add_local_policy(m, src)
        st.gc()
    assert all((src / f.name).exists() for f in m.files)


def test_second_process_on_the_same_data_dir_is_refused(tmp_path):
    with PieceStore(tmp_path / "data"):
        with pytest.raises(StoreLockedError, match="in use"):
            PieceStore(tmp_path / "data")
        code = ("import sys; from p2p.pieces.store import PieceStore\ntry:\n PieceStore(sys.argv[1])\n"
                "except Exception as e:\n print(type(e).__name__)")
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "data")], capture_output=True, text=True)
        assert out.stdout.strip() == "StoreLockedError"
    PieceStore(tmp_path / "data").close()  # released on close


def test_full_disk_is_one_clear_error_and_leaves_nothing_corrupt(tmp_path, policy, monkeypatch):
    src, m, _ = policy
    st = PieceStore(tmp_path / "data")
    st.add_manifest(m)

    def no_space(*_a, **_k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(store_mod.os, "pwrite", no_space)
    with pytest.raises(DiskFullError, match="disk is full"):
        fill(st, m, src, [0])
    assert not st.has_piece(m, 0)
    monkeypatch.undo()
    st.close()
    with PieceStore(tmp_path / "data") as st2:
        assert not any(st2.bitfield(m))
        fill(st2, m, src, range(m.num_pieces))
        assert st2.is_complete(m)


def test_a_full_disk_found_when_the_last_piece_is_flushed_keeps_the_file_partial(tmp_path, policy, monkeypatch):
    """File systems that allocate late report a full disk at fsync, not at the write: that was a bare OSError
    (a traceback), and the file must not be renamed complete when its bytes may not be on disk."""
    src, m, _ = policy
    st = PieceStore(tmp_path / "data")
    st.add_manifest(m)
    entry = m.files[0]
    first_file = [i for i, ref in enumerate(m.pieces) if ref.file.root == entry.root]

    def no_space(_fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    fill(st, m, src, first_file[:-1])
    monkeypatch.setattr(store_mod.os, "fsync", no_space)
    with pytest.raises(DiskFullError, match="disk is full while flushing"):
        fill(st, m, src, first_file[-1:])
    monkeypatch.undo()
    files = tmp_path / "data" / "files"
    assert (files / f"{entry.root.hex()}.part").exists() and not (files / f"{entry.root.hex()}.data").exists()
    st.close()
    with PieceStore(tmp_path / "data") as st2:  # the restart re-hashes the partial file and completes it
        assert [st2.has_piece(m, i) for i in first_file] == [True] * len(first_file)
        assert (files / f"{entry.root.hex()}.data").exists()


def test_signed_manifest_bytes_survive_a_restart(tmp_path, policy):
    src, m, _ = policy
    sign, pub = keypair()
    signed = sign_manifest(m, sign, pub).to_bytes()
    with PieceStore(tmp_path / "data") as st:
        st.add_manifest(m, signed)
    with PieceStore(tmp_path / "data") as st:
        assert st.signed_manifest_bytes(m.id) == signed and st.manifest(m.id) == m


def test_reassemble_refuses_an_incomplete_policy(tmp_path, policy):
    _, m, _ = policy
    with PieceStore(tmp_path / "data") as st:
        st.add_manifest(m)
        with pytest.raises(StoreError, match="not complete"):
            st.reassemble(m, tmp_path / "out")
    assert not (tmp_path / "out" / m.files[0].name).exists()


def test_a_data_file_is_reassembled_byte_identical_beside_the_weights(tmp_path, policy):
    src, _, _ = policy
    (src / "arith.jsonl").write_bytes(b'{"prompt": "1 + 1 =", "answer": "2"}\n' * 9000)
    m = build(src, data_files=("arith.jsonl",))
    with PieceStore(tmp_path / "data") as st:
        st.add_manifest(m)
        fill(st, m, src, range(m.num_pieces))
        out = st.reassemble(m, tmp_path / "out")
    assert (out / "arith.jsonl").read_bytes() == (src / "arith.jsonl").read_bytes()


def test_a_complete_file_that_changed_on_disk_is_caught_on_first_read_and_refetched_after_a_restart(tmp_path, policy):
    """A complete file is trusted by name and size at start (hashing a big policy on every start costs seconds);
    each piece is hashed the first time it is read instead, and one that went bad is never served again."""
    from p2p.errors import CorruptPieceError

    src, m, _ = policy
    with PieceStore(tmp_path / "data") as st:
        st.add_manifest(m)
        fill(st, m, src, range(m.num_pieces))
    entry = m.files[0]
    data_file = tmp_path / "data" / "files" / f"{entry.root.hex()}.data"
    rotten = bytearray(data_file.read_bytes())
    rotten[5] ^= 0x80  # inside piece 0 of the first file
    data_file.write_bytes(bytes(rotten))
    with PieceStore(tmp_path / "data") as st:
        assert st.is_complete(m) and all(st.bitfield(m))  # trusted by name and size
        assert st.read_piece(m, 1) == (src / entry.name).read_bytes()[m.pieces[1].offset :][: m.pieces[1].length]
        for _ in range(2):  # caught on the first read, and refused (not re-read) after
            with pytest.raises(CorruptPieceError, match="changed on disk"):
                st.read_piece(m, 0)
        assert not st.has_piece(m, 0) and not st.is_complete(m)
        assert not data_file.exists() and data_file.with_suffix(".part").exists()
    with PieceStore(tmp_path / "data") as st:  # a restart rescans the partial file: only piece 0 is fetched again
        assert [i for i, b in enumerate(st.bitfield(m)) if not b] == [0]
        fill(st, m, src, [0])
        assert st.is_complete(m) and st.read_piece(m, 0) == (src / entry.name).read_bytes()[: m.pieces[0].length]
