"""The on-disk, content-addressed piece store of one peer.

Layout of a data directory:

    store.lock                  flock'ed for the life of the PieceStore: a second process gets StoreLockedError
    manifests/<id>.manifest     the signed manifest bytes (or the unsigned canonical bytes) of every version held
    files/<root>.part           a file being downloaded: its final size, pieces written in place with os.pwrite
    files/<root>.data           a complete file, every piece verified (renamed from .part when the last lands)
    local.json                  root -> absolute path of ORIGINAL files served in place (a trainer's checkpoint)

Why one sparse file per policy file, addressed by its root, rather than one file per piece: writes and reads are a
single pwrite/pread at an offset (no directory with 60,000 entries, no open/close per piece), finishing is a rename,
reassembly is a sequential copy, and two versions that share an unchanged file share its bytes. There is no
completion bitmap to keep in sync with the data: on open, a .part file is re-hashed piece by piece (BLAKE3 is about
4 GiB/s), so whatever survived a crash or power loss is exactly what is trusted, and the rest is fetched again.
RSS stays at one piece: every read and write goes through a piece-sized buffer.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import blake3

from p2p.errors import CorruptPieceError, DiskFullError, ManifestError, PieceVerifyError, StoreError, StoreLockedError
from p2p.pieces.manifest import MODEL_FILE, FileEntry, PolicyManifest, decode_manifest, decode_signed, tensor_digest

LOCK_NAME = "store.lock"
_SIGNED_MARK = b"\x83"  # a signed manifest is a 3-entry msgpack map; an unsigned one has 9


def _enospc(exc: OSError, what: str) -> StoreError:
    if exc.errno == errno.ENOSPC:
        return DiskFullError(f"the disk is full while {what}; free space and restart (nothing corrupt was kept)")
    return StoreError(f"I/O error while {what}: {exc.strerror}")


@contextmanager
def _disk(what: str) -> Iterator[None]:
    """Turn an OSError of the disk into one user-facing StoreError (DiskFullError when it is full)."""
    try:
        yield
    except OSError as exc:
        raise _enospc(exc, what) from None


def _atomic_write(path: Path, data: bytes, what: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise _enospc(exc, what) from None


def check_rebuilt(manifest: PolicyManifest, name: str, path: Path) -> None:
    """Raise PieceVerifyError unless the file at `path` is, piece by piece, the manifest's weight file `name`."""
    entry = next((e for e in manifest.files if e.name == name and name.endswith(".safetensors")), None)
    if entry is None:
        raise PieceVerifyError(f"rebuilt {name!r} is no weight file of policy v{manifest.version}")
    with _disk(f"checking rebuilt {name}"), open(path, "rb", buffering=0) as fh:
        if os.fstat(fh.fileno()).st_size != entry.size:
            raise PieceVerifyError(f"rebuilt {name} has {os.fstat(fh.fileno()).st_size} bytes, not {entry.size}")
        for i, expected in enumerate(entry.piece_hashes):
            data = os.pread(fh.fileno(), entry.piece_length(i), i * entry.piece_size)
            if blake3.blake3(data).digest() != expected:
                raise PieceVerifyError(f"piece {i} of rebuilt {name} does not match the signed manifest")


def _check_tensor_hashes(manifest: PolicyManifest, directory: Path) -> None:
    """Every tensor hashes as its manifest signs: a loader that copies only the tensors whose hashes changed since
    its last version must be able to trust them, whichever form of the version this peer fetched."""
    for tensor in manifest.tensors:
        with _disk(f"checking {tensor.file}"):
            digest = tensor_digest(directory / tensor.file, tensor.offset, tensor.nbytes)
        if digest != tensor.hash:
            raise PieceVerifyError(f"tensor {tensor.name!r} of policy v{manifest.version} does not match its signed "
                                   "hash")


def _full_files(manifest: PolicyManifest) -> list[FileEntry]:
    patch = manifest.patch_file
    return [e for e in manifest.files if e is not patch]


class _FileState:
    """Which pieces of one file (by root) are held, and the open descriptor that serves them."""

    def __init__(self, entry: FileEntry, path: Path, have: bytearray, complete: bool) -> None:
        self.entry = entry
        self.path = path
        self.have = have
        self.missing = have.count(0)
        self.complete = complete
        with _disk(f"opening {path.name}"):
            self.fd = os.open(path, os.O_RDWR if not complete else os.O_RDONLY)
        # pieces whose bytes on disk this process has hashed (on write, on a rescan or on their first read): a
        # complete file is trusted by its name and size at start, and checked piece by piece as it is served
        self.checked = bytearray(have) if not complete else bytearray(len(have))
        self.corrupt: set[int] = set()

    def close(self) -> None:
        os.close(self.fd)


class PieceStore:
    """Content-addressed pieces and manifests in one data directory owned by this process."""

    def __init__(self, data_dir: Path | str, keep_versions: int = 3) -> None:
        self.dir = Path(data_dir)
        self.keep_versions = keep_versions
        (self.dir / "manifests").mkdir(parents=True, exist_ok=True)
        (self.dir / "files").mkdir(exist_ok=True)
        self._lock_fd = self._take_lock()
        self._manifests: dict[bytes, PolicyManifest] = {}
        self._files: dict[bytes, _FileState] = {}
        self._local: dict[str, str] = self._read_local()
        shutil.rmtree(self.dir / "rebuild", ignore_errors=True)  # files a crash left half rebuilt from a patch
        for path in sorted((self.dir / "manifests").glob("*.manifest")):
            self._load_manifest_file(path)
        self._drop_orphans()

    # ------------------------------------------------------------------ lifecycle

    def _drop_orphans(self) -> None:
        """Delete stored files no manifest held names (their manifest was dropped, or no longer decodes)."""
        for path in (self.dir / "files").iterdir():
            if path.suffix in (".data", ".part") and bytes.fromhex(path.stem) not in self._files:
                path.unlink(missing_ok=True)

    def _take_lock(self) -> int:
        fd = os.open(self.dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreLockedError(f"the data directory {self.dir} is in use by another swarm process") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        return fd

    def close(self) -> None:
        for state in self._files.values():
            state.close()
        self._files.clear()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = -1

    def __enter__(self) -> PieceStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ manifests

    def _read_local(self) -> dict[str, str]:
        path = self.dir / "local.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def _load_manifest_file(self, path: Path) -> None:
        """Reload a stored manifest; one that no longer decodes is deleted (it can be fetched again)."""
        raw = path.read_bytes()
        try:
            inner = decode_signed(raw).manifest_bytes if raw[:1] == _SIGNED_MARK else raw
            self._register(decode_manifest(inner))
        except ManifestError:
            path.unlink(missing_ok=True)

    def add_manifest(self, manifest: PolicyManifest, signed_bytes: bytes | None = None) -> None:
        """Keep a (verified) manifest and open or create the files it names; idempotent."""
        if manifest.id not in self._manifests:
            path = self.dir / "manifests" / f"{manifest.id.hex()}.manifest"
            _atomic_write(path, signed_bytes if signed_bytes is not None else manifest.encode(), "saving a manifest")
        self._register(manifest)

    def add_local_policy(
        self, manifest: PolicyManifest, src_dir: Path | str, signed_bytes: bytes | None = None
    ) -> None:
        """Serve the ORIGINAL files of a policy in place (no copy): the trainer's own checkpoint directory."""
        src_dir = Path(src_dir).resolve()
        for entry in manifest.files:
            src = src_dir / entry.name
            if not src.is_file() or src.stat().st_size != entry.size:
                raise StoreError(f"{src} is missing or does not match the manifest's size")
            self._local[entry.root.hex()] = str(src)
        _atomic_write(self.dir / "local.json", json.dumps(self._local).encode(), "saving local sources")
        self.add_manifest(manifest, signed_bytes)

    def signed_manifest_bytes(self, manifest_id: bytes) -> bytes:
        """The bytes to hand to another peer (signed when we received or made them signed)."""
        return (self.dir / "manifests" / f"{manifest_id.hex()}.manifest").read_bytes()

    def manifest(self, manifest_id: bytes) -> PolicyManifest | None:
        return self._manifests.get(manifest_id)

    def manifests(self) -> list[PolicyManifest]:
        """Every manifest held, oldest version first."""
        return sorted(self._manifests.values(), key=lambda m: (m.run, m.version))

    def _register(self, manifest: PolicyManifest) -> None:
        self._manifests[manifest.id] = manifest
        for entry in manifest.files:
            if entry.root not in self._files:
                self._files[entry.root] = self._open_file(entry)

    def _open_file(self, entry: FileEntry) -> _FileState:
        n = len(entry.piece_hashes)
        local = self._local.get(entry.root.hex())
        if local is not None and os.path.isfile(local) and os.path.getsize(local) == entry.size:
            return _FileState(entry, Path(local), bytearray(b"\x01" * n), complete=True)
        done = self.dir / "files" / f"{entry.root.hex()}.data"
        if done.exists():
            return _FileState(entry, done, bytearray(b"\x01" * n), complete=True)
        part = self.dir / "files" / f"{entry.root.hex()}.part"
        fresh = not part.exists()
        with _disk(f"creating {part.name}"), open(part, "ab") as fh:
            fh.truncate(entry.size)  # sparse: no blocks are used until pieces land
        state = _FileState(entry, part, bytearray(n), complete=False)
        if not fresh:  # a brand-new sparse file holds nothing worth hashing
            self._rescan(state)
        return state

    def _rescan(self, state: _FileState) -> None:
        """Trust exactly the pieces whose bytes on disk hash right (resume after a crash or restart)."""
        entry = state.entry
        for i, expected in enumerate(entry.piece_hashes):
            with _disk(f"reading {state.path.name}"):
                data = os.pread(state.fd, entry.piece_length(i), i * entry.piece_size)
            state.have[i] = blake3.blake3(data).digest() == expected
        state.checked[:] = state.have
        state.missing = state.have.count(0)
        if state.missing == 0:
            self._finish(state)

    # ------------------------------------------------------------------ pieces

    def bitfield(self, manifest: PolicyManifest) -> bytearray:
        """One 0/1 flag per global piece of the manifest."""
        out = bytearray()
        for entry in manifest.files:
            out += self._files[entry.root].have
        return out

    def is_complete(self, manifest: PolicyManifest) -> bool:
        return all(self._files[e.root].complete for e in manifest.files)

    def holds_full(self, manifest: PolicyManifest) -> bool:
        """Whether every file of the version's full form (all but its patch) is complete."""
        return all(self._files[e.root].complete if e.root in self._files else False for e in _full_files(manifest))

    def weight_paths(self, manifest: PolicyManifest) -> list[Path]:
        """Where the complete safetensors files of a version held in full lie (to rebuild a child from them)."""
        return [self._files[e.root].path for e in manifest.files if e.name.endswith(".safetensors")]

    def file_path(self, manifest: PolicyManifest, name: str) -> Path:
        """Where the complete file `name` of a held version lies."""
        state = self._files[next(e.root for e in manifest.files if e.name == name)]
        if not state.complete:
            raise StoreError(f"{name} of policy version {manifest.version} is not complete")
        return state.path


    def adopt_rebuilt(self, manifest: PolicyManifest, name: str, path: Path) -> list[int]:
        """Take a file rebuilt outside the protocol and checked by `check_rebuilt` as the manifest's file `name`;
        returns the global indices of the pieces newly held. `path` is renamed into place (same file system)."""
        entry = next(e for e in manifest.files if e.name == name)
        state = self._files[entry.root]
        first = next(p.index for p in manifest.pieces if p.file.root == entry.root)
        added = list(range(first, first + len(entry.piece_hashes)))  # the caller's engine skips what it holds
        if state.complete:  # another version completed the same file meanwhile
            path.unlink(missing_ok=True)
            return added
        done = self.dir / "files" / f"{entry.root.hex()}.data"
        with _disk(f"storing rebuilt {name}"):
            os.replace(path, done)
            state.close()
            if state.path != done:
                state.path.unlink(missing_ok=True)
        state.path, state.complete, state.missing = done, True, 0
        state.have[:] = b"\x01" * len(state.have)
        state.checked[:] = state.have
        state.corrupt.clear()
        with _disk(f"opening {done.name}"):
            state.fd = os.open(done, os.O_RDONLY)
        return added

    def rebuild_dir(self) -> Path:
        """A scratch directory on the store's file system for files being rebuilt."""
        path = self.dir / "rebuild"
        path.mkdir(exist_ok=True)
        return path

    def has_piece(self, manifest: PolicyManifest, index: int) -> bool:
        ref = manifest.pieces[index]
        return bool(self._files[ref.file.root].have[ref.local_index])

    def read_piece(self, manifest: PolicyManifest, index: int) -> bytes:
        """The bytes of one held piece, read with a single pread (never the whole file).

        A piece not yet hashed in this process is hashed now (once): a file changed on disk after it was stored
        (bit rot, an overwritten checkpoint) must not be served, or every receiver drops this honest peer as a
        liar while the bad bytes go on being offered. Such a piece raises CorruptPieceError from then on, and a
        file of the store's own becomes a partial file again, so a restart re-fetches what it lost.
        """
        ref = manifest.pieces[index]
        state = self._files[ref.file.root]
        i = ref.local_index
        if not state.have[i]:
            if i in state.corrupt:
                raise CorruptPieceError(f"piece {index} of policy v{manifest.version} changed on disk ({state.path})")
            raise StoreError(f"piece {index} of manifest {manifest.id.hex()[:12]} is not held")
        with _disk(f"reading piece {index} from {state.path.name}"):
            data = os.pread(state.fd, ref.length, ref.offset)
        if not state.checked[i]:
            if len(data) != ref.length or blake3.blake3(data).digest() != ref.hash:
                self._lose_piece(state, i)
                raise CorruptPieceError(f"piece {index} of policy v{manifest.version} changed on disk since it was "
                                        f"stored ({state.path}); it is no longer served")
            state.checked[i] = 1
        return data

    def _lose_piece(self, state: _FileState, i: int) -> None:
        """Forget a held piece whose bytes went bad; a complete file of ours is renamed back to a partial one."""
        state.have[i] = 0
        state.missing += 1
        state.corrupt.add(i)
        if state.complete and state.path.suffix == ".data" and state.path.parent == self.dir / "files":
            part = state.path.with_suffix(".part")
            with _disk(f"turning {state.path.name} back into a partial file"):
                os.replace(state.path, part)
                state.close()
                state.path, state.complete = part, False
                state.fd = os.open(part, os.O_RDWR)

    def write_piece(self, manifest: PolicyManifest, index: int, data: bytes, verify: bool = True) -> bool:
        """Store one piece; returns True when it completed its file. Refuses bytes that do not hash right."""
        ref = manifest.pieces[index]
        state = self._files[ref.file.root]
        if state.have[ref.local_index]:
            return False
        if len(data) != ref.length or (verify and blake3.blake3(data).digest() != ref.hash):
            raise PieceVerifyError(f"piece {index} does not match the hash in the signed manifest")
        with _disk(f"writing piece {index}"):
            written = os.pwrite(state.fd, data, ref.offset)
        if written != len(data):
            raise StoreError(f"short write of piece {index}")
        state.have[ref.local_index] = 1
        state.checked[ref.local_index] = 1
        state.corrupt.discard(ref.local_index)
        state.missing -= 1
        if state.missing == 0:
            self._finish(state)
            return True
        return False

    def _finish(self, state: _FileState) -> None:
        """Flush a file whose last piece landed and rename it complete. A flush that fails (a full disk shows up
        here when the file system allocates late) leaves the partial file, whose pieces a restart re-hashes."""
        done = state.path.with_suffix(".data")
        with _disk(f"flushing {state.path.name}"):
            os.fsync(state.fd)
            os.replace(state.path, done)
        state.close()
        state.path, state.complete = done, True
        with _disk(f"opening {done.name}"):
            state.fd = os.open(done, os.O_RDONLY)

    # ------------------------------------------------------------------ output and GC

    def reassemble(self, manifest: PolicyManifest, out_dir: Path | str) -> Path:
        """Write the policy's files (and model.json) into out_dir, each checked piece by piece, via rename."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        if not self.holds_full(manifest):
            raise StoreError(f"policy version {manifest.version} is not complete yet")
        for entry in _full_files(manifest):
            self._copy_verified(manifest, entry, out_dir / entry.name)
        _check_tensor_hashes(manifest, out_dir)
        model = json.dumps(manifest.model, sort_keys=True, indent=1).encode()
        _atomic_write(out_dir / MODEL_FILE, model, "writing model.json")
        return out_dir

    def _copy_verified(self, manifest: PolicyManifest, entry: FileEntry, dest: Path) -> None:
        state = self._files[entry.root]
        tmp = dest.with_name(f".{dest.name}.tmp")
        try:
            with open(tmp, "wb") as out:
                for i, expected in enumerate(entry.piece_hashes):
                    data = os.pread(state.fd, entry.piece_length(i), i * entry.piece_size)
                    if blake3.blake3(data).digest() != expected:
                        raise PieceVerifyError(f"stored piece {i} of {entry.name} is corrupt; delete it and refetch")
                    out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, dest)
        except OSError as exc:
            raise _enospc(exc, f"writing {dest.name}") from None
        finally:
            tmp.unlink(missing_ok=True)

    def gc(self, keep: int | None = None, pinned: set[bytes] = frozenset()) -> list[PolicyManifest]:
        """Forget all but the newest `keep` versions of each run (and the pinned ids); returns what was dropped."""
        keep = self.keep_versions if keep is None else keep
        by_run: dict[str, list[PolicyManifest]] = {}
        for m in self.manifests():
            by_run.setdefault(m.run, []).append(m)
        dropped = [m for ms in by_run.values() for m in ms[: max(0, len(ms) - keep)] if m.id not in pinned]
        for m in dropped:
            del self._manifests[m.id]
            (self.dir / "manifests" / f"{m.id.hex()}.manifest").unlink(missing_ok=True)
        live = {e.root for m in self._manifests.values() for e in m.files}
        for root in [r for r in self._files if r not in live]:
            state = self._files.pop(root)
            state.close()
            if self._local.pop(root.hex(), None) is None:  # never delete a trainer's original files
                state.path.unlink(missing_ok=True)
        if dropped:
            _atomic_write(self.dir / "local.json", json.dumps(self._local).encode(), "saving local sources")
        return dropped
