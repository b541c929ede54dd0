"""Sans-IO record layer of the fast data channel: AEAD records with ordered, final-flagged nonces.

Why our own record layer instead of the libp2p stream: py-libp2p's Noise+Yamux stream moves about 0.25x of raw TCP
(docs/reference.md#py-libp2p-pitfalls: Yamux framing and Noise messages of at most 64 KiB, all in Python). One AEAD call
per 1 MiB record (`cryptography`) costs 0.25-0.6 ms here, yet it is still the largest cost of the channel: seal and open
each cost about as much as the kernel's copy plus the BLAKE3 hash of the same MiB. Why three ciphers: measured on this
project's 2-core machines (encrypt / decrypt of 1 MiB, ms): AES-256-OCB3 0.20-0.25 / 0.26-0.29, AES-256-GCM 0.30-0.44 /
0.37-0.47, ChaCha20-Poly1305 0.56-0.59 / 0.62-0.65; on a 2-core AMD EPYC, OCB3 0.16 / 0.15 and GCM 0.11 / 0.10
(OpenSSL's vectorised GCM), so the listener measures which AES mode is faster (`preferred_aead`). OCB3 (RFC 7253) needs
one AES pass and no GHASH; GCM is the widely deployed choice; without AES hardware ChaCha20 is the fast one. All three
are AEADs with 12-byte nonces and 16-byte tags used identically below. The dialer lists the ciphers it supports, the
listener picks (`choose_aead`) and names it in its offer, the dialer follows.

Record on the wire:   | u32 ciphertext length | u8 flags | ciphertext (plaintext + 16-byte tag) |
Nonce (12 bytes):     | u8 direction | 3 zero bytes | u64 record index |
Associated data:      b"rlsw-dc1" | u8 direction | u64 record index | u8 flags

The index is never sent: each side counts, so a reordered, replayed or dropped record fails its tag. The direction
byte keeps the two directions' nonces apart under one key (and stops a peer reflecting our own records back). The
flags byte is authenticated, so a truncation cannot pass for a clean end: only a record with FINAL set ends the
stream. No IO here: the sealer writes into a caller's buffer (one record may be sealed from several parts, see
`seal_parts_into`); the opener returns fresh bytes for small records and decrypts a big one into a reused buffer
(`PlaintextPool`).
"""

from __future__ import annotations

import functools
import struct
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence

from cryptography.exceptions import InvalidTag, UnsupportedAlgorithm
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, AESOCB3, ChaCha20Poly1305

from p2p.errors import ChannelError, ChannelTamperedError

KEY_BYTES = 32
COPY_LIMIT = 64 * 1024
"""Parts up to this size are copied together into one record; larger ones are sealed where they lie."""
MAX_RECORD = 1024 * 1024
"""Largest plaintext per record: big enough that per-record costs vanish, small enough to bound buffers."""
TAG = 16
HEADER = struct.Struct(">IB")
FINAL = 0x01
_NONCE = struct.Struct(">B3xQ")
_AD = struct.Struct(">8sBQB")
_AD_LABEL = b"rlsw-dc1"
CHACHA20_POLY1305 = "chacha20-poly1305"
AES_256_GCM = "aes-256-gcm"
AES_256_OCB3 = "aes-256-ocb3"
LEGACY_AEADS = (AES_256_GCM, CHACHA20_POLY1305)
"""What a dialer that lists no ciphers supports."""


def _available(cls) -> bool:
    try:
        cls(bytes(KEY_BYTES))
    except UnsupportedAlgorithm:  # e.g. OCB3 on a cryptography built against a library without it
        return False
    return True


AEADS = {name: cls for name, cls in ((CHACHA20_POLY1305, ChaCha20Poly1305), (AES_256_GCM, AESGCM),
                                     (AES_256_OCB3, AESOCB3)) if _available(cls)}
"""The ciphers this process can use; each takes a 32-byte key and a 12-byte nonce."""
DIALER, LISTENER = 0, 1
"""Direction bytes: records written by the side that dialed the data socket, and by the side that accepted it."""


def _make_aead(key: bytes, name: str):
    if len(key) != KEY_BYTES:
        raise ChannelError("data channel key must be 32 bytes")
    if name not in AEADS:
        raise ChannelError(f"unknown data channel cipher {name!r}")
    return AEADS[name](bytes(key))


@functools.cache
def preferred_aead() -> str:
    """Where the CPU has AES instructions, whichever AES mode seals and opens a record fastest here; else
    ChaCha20-Poly1305. Measured once per process (a few milliseconds).

    The same reasoning as TLS stacks: ChaCha20 is the fast cipher without AES hardware, AES the fast one with it.
    Which AES mode wins depends on the CPU and on the OpenSSL build: OCB3 needs one AES pass and no GHASH, and wins
    on a 2-core Intel machine (decrypt 0.27 vs 0.42 ms/MiB), while OpenSSL's vectorised (VAES) GCM wins on a
    2-core AMD EPYC (0.10 vs 0.16 ms/MiB; end to end 0.41 vs 0.49 ms per MiB in pinned, interleaved transfer
    runs; docs/benchmarks.md#one-stream). A fixed choice is wrong on one of them, so we measure.
    Linux x86 and ARM report the feature as an "aes" flag in /proc/cpuinfo; anywhere else we keep ChaCha20.
    """
    if not _cpu_has_aes():
        return CHACHA20_POLY1305
    return fastest_aead([name for name in (AES_256_OCB3, AES_256_GCM) if name in AEADS])


def _cpu_has_aes() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return "aes" in line.split(":", 1)[1].split()
    except OSError:
        pass
    return False


def fastest_aead(names: Sequence[str], measure: Callable[[Sequence[str]], dict[str, float]] | None = None) -> str:
    """The cipher among `names` with the shortest measured record time; the earlier name on a tie."""
    if len(names) == 1:
        return names[0]
    seconds = (measure or record_seconds)(names)
    return min(names, key=lambda name: seconds[name])


def record_seconds(names: Sequence[str], size: int = MAX_RECORD, rounds: int = 5) -> dict[str, float]:
    """Best wall time of sealing and opening one `size`-byte record, per cipher.

    Rounds alternate between the ciphers, so a burst of load on a shared machine slows all of them alike, and the
    best round counts: noise only ever adds time.
    """
    plaintext, sealed, opened = bytes(size), bytearray(size + TAG), bytearray(size)
    nonce, best = bytes(12), dict.fromkeys(names, float("inf"))
    aeads = {name: _make_aead(bytes(KEY_BYTES), name) for name in names}
    for _ in range(rounds + 1):  # the first round warms caches and code paths up
        for name, aead in aeads.items():
            start = time.perf_counter()
            aead.encrypt_into(nonce, plaintext, b"", sealed)
            aead.decrypt_into(nonce, sealed, b"", opened)
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def choose_aead(preferred: str, dialer_supports: object) -> str:
    """The cipher a listener offers: its own preference if the dialer supports it, else GCM, else ChaCha20.

    `dialer_supports` is the dialer's list from its request (hostile until checked); None means an older dialer.
    """
    if dialer_supports is None:
        dialer_supports = list(LEGACY_AEADS)
    if not isinstance(dialer_supports, list) or not all(isinstance(name, str) for name in dialer_supports):
        raise ChannelError("data channel request lists its ciphers in a malformed way")
    for name in (preferred, AES_256_GCM, CHACHA20_POLY1305):
        if name in dialer_supports and name in AEADS:
            return name
    raise ChannelError(f"no data channel cipher in common (peer supports {dialer_supports[:8]!r})")


RECORD_BYTES = HEADER.size + MAX_RECORD + TAG
"""Bytes of the largest sealed record on the wire."""


def record_buffer() -> bytearray:
    """A buffer large enough for one sealed record of the maximum size."""
    return bytearray(RECORD_BYTES)


def split_records(
    parts: Sequence[memoryview], limit: int = MAX_RECORD, copy_limit: int = COPY_LIMIT
) -> Iterator[list[memoryview]]:
    """Cut the concatenation of `parts` into groups of at most `limit` bytes, by slicing only.

    Each group becomes one record (`RecordSealer.seal_parts_into`). Small parts share a record (sealing copies
    them together, which is cheap); a part over `copy_limit` starts a record of its own, so a piece frame is a tiny
    header record and a payload record sealed straight from the payload. Why not one record for both: on these
    machines a copy of a MiB costs 0.1-0.2 ms, as much as the second small record costs both sides together.
    """
    group: list[memoryview] = []
    room = limit
    for view in parts:
        big = len(view) > copy_limit
        if big and group:
            yield group
            group, room = [], limit
        while len(view):
            take = view[:room]
            group.append(take)
            room -= len(take)
            view = view[len(take) :]
            if room == 0 or (big and not len(view)):
                yield group
                group, room = [], limit
    if group:
        yield group


class _RecordDirection:
    """One direction's cipher and record counter, shared by the sealing and the opening side."""

    def __init__(self, key: bytes, direction: int, aead: str = CHACHA20_POLY1305) -> None:
        self._aead = _make_aead(key, aead)
        self.aead = aead
        self._direction = direction
        self.index = 0
        self.finished = False


class RecordSealer(_RecordDirection):
    """Turns plaintext chunks into sealed records for one direction, counting record indices."""

    def seal_into(self, plaintext: bytes | bytearray | memoryview, out: bytearray, final: bool = False) -> int:
        """Seal one record of at most MAX_RECORD bytes into `out`; return the number of bytes to send."""
        return self.seal_parts_into([plaintext], out, final)

    def seal_parts_into(
        self, parts: Sequence[bytes | bytearray | memoryview], out: bytearray, final: bool = False
    ) -> int:
        """Seal the concatenation of `parts` (at most MAX_RECORD bytes) as ONE record into `out`; return its size.

        One part is sealed from where it lies; several are copied into `out` and sealed there in place (OpenSSL's
        AEADs take an output that exactly overlaps the input), so `split_records` groups only small parts.
        No part may overlap `out`.
        """
        size = sum(len(part) for part in parts)
        if size > MAX_RECORD:
            raise ValueError(f"record plaintext of {size} bytes exceeds {MAX_RECORD}")
        if self.finished:
            raise ChannelError("data channel already sent its final record")
        flags = FINAL if final else 0
        HEADER.pack_into(out, 0, size + TAG, flags)
        nonce = _NONCE.pack(self._direction, self.index)
        aad = _AD.pack(_AD_LABEL, self._direction, self.index, flags)
        body = memoryview(out)[HEADER.size : HEADER.size + size + TAG]
        if len(parts) <= 1:
            self._aead.encrypt_into(nonce, parts[0] if parts else b"", aad, body)
        else:
            _copy_parts(parts, body)
            self._aead.encrypt_into(nonce, body[:size], aad, body)
        self.index += 1
        self.finished = final
        return HEADER.size + size + TAG


def _copy_parts(parts: Sequence, body: memoryview) -> None:
    pos = 0
    for part in parts:
        body[pos : pos + len(part)] = part
        pos += len(part)


class RecordOpener(_RecordDirection):
    """Checks and opens the records of one direction, in order; any deviation is a ChannelError."""

    def parse_header(self, header: bytes | bytearray | memoryview) -> tuple[int, int]:
        """(ciphertext length, flags) of the next record; refuses sizes a sealer never produces."""
        if self.finished:
            raise ChannelTamperedError("data received after the peer's final record")
        length, flags = HEADER.unpack(header)
        if length < TAG or length > MAX_RECORD + TAG or flags & ~FINAL:
            raise ChannelTamperedError(f"malformed data channel record header (length {length}, flags {flags:#x})")
        return length, flags

    def open(self, flags: int, ciphertext: memoryview, pool: PlaintextPool | None = None) -> bytes | bytearray:
        """Authenticate and decrypt one record, handed to the reader without a copy: a new bytes object, or for a
        record over COPY_LIMIT a buffer of exactly its size from `pool` (see PlaintextPool for who owns it)."""
        nonce = _NONCE.pack(self._direction, self.index)
        aad = _AD.pack(_AD_LABEL, self._direction, self.index, flags)
        size = len(ciphertext) - TAG
        try:
            if pool is not None and size > COPY_LIMIT:
                plaintext = pool.acquire(size)
                self._aead.decrypt_into(nonce, ciphertext, aad, plaintext)
            else:
                plaintext = self._aead.decrypt(nonce, ciphertext, aad)
        except InvalidTag as exc:
            raise ChannelTamperedError(f"data channel record {self.index} failed authentication "
                                       "(tampered or out of order)") from exc
        self.index += 1
        self.finished = bool(flags & FINAL)
        return plaintext


def _unreferenced_count() -> int:
    """What sys.getrefcount reports for a list member seen through a loop variable that nothing else holds."""
    for buffer in [bytearray(1)]:
        return sys.getrefcount(buffer)
    raise AssertionError("unreachable")


_UNREFERENCED = _unreferenced_count()


class PlaintextPool:
    """Reused plaintext buffers for big records, handed out again only once nothing references them.

    Why: decrypting each 1 MiB record into a fresh object costs an allocation, its page faults and a cold cache
    line per byte, about a third as much as the decryption itself on these machines. Why no release call: the
    reader hands the buffer itself to the frame decoder, which hands it on as a piece payload that the transfer
    layer hashes, stores or keeps; CPython's reference count (a memoryview of a buffer holds a reference too)
    says exactly when the last of them let go, so a buffer still held anywhere is never overwritten. At most
    `per_size` buffers of each of the `sizes` most recent record sizes are kept; past that a buffer is fresh.
    """

    def __init__(self, per_size: int = 3, sizes: int = 2) -> None:
        self.per_size = per_size
        self.sizes = sizes
        self._by_size: OrderedDict[int, list[bytearray]] = OrderedDict()

    def acquire(self, size: int) -> bytearray:
        buffers = self._by_size.pop(size, [])
        self._by_size[size] = buffers  # most recently used size last
        for buffer in buffers:
            if sys.getrefcount(buffer) <= _UNREFERENCED:
                return buffer
        buffer = bytearray(size)
        if len(buffers) < self.per_size:
            buffers.append(buffer)
        while len(self._by_size) > self.sizes:
            self._by_size.popitem(last=False)
        return buffer

    @property
    def held_bytes(self) -> int:
        """Bytes of plaintext buffers kept for reuse."""
        return sum(len(b) for buffers in self._by_size.values() for b in buffers)
