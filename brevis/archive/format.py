"""Archive format v1: the fixed-size header and footer (see docs/FORMAT.md).

    header  16 bytes   magic, format version (u16), flags (u16), reserved (u32)
    streams ...        the coded streams, back to back
    index   ...        zstd-compressed UTF-8 JSON (see index.py)
    footer  48 bytes   index offset, stored and raw index length (u64 each),
                       first 16 bytes of the SHA-256 of the stored index,
                       end magic
All integers are little-endian.
"""

from __future__ import annotations

import hashlib
import math
import struct
import zlib
from dataclasses import dataclass

from blake3 import blake3
from xxhash import xxh3_64_intdigest, xxh3_128_digest

try:  # the same hashes, the GIL released on large chunks and streams
    from ..native._rans import check as _xxh3_low32, digest as _xxh3_128
except ImportError:
    _xxh3_128 = xxh3_128_digest

    def _xxh3_low32(data) -> int:
        return xxh3_64_intdigest(data) & 0xFFFFFFFF

from ..errors import FormatError, TruncatedError, UnsupportedVersion

MAGIC = b"\x89BRV\r\n\x1a\n"
END_MAGIC = b"BRVINDEX"
VERSION = 9  # the newest version this Brevis reads and writes
# Version 2 is version 1 with symbolic links in the index (`links`): written
# only for an archive that holds links, so that a reader that knows version
# 1 alone refuses it ("upgrade Brevis") rather than dropping its links.
# Version 3 checks chunks with BLAKE3 instead of SHA-256 (6.5 against 1.8
# GB/s on one core here: SHA-256 was 14 % of decoding minilm) and stored
# streams with the low 32 bits of XXH3-64 instead of CRC-32 (62 against 4.3
# GB/s: the CRC was 7-10 % of decoding), and may hold gathered segments
# (`ranges`). Version 4 is version 3 whose `ans` streams may have wide
# blocks (32 rANS states, decoded eight at a time with AVX2: 1.6-2.5x faster).
# Version 5 is version 4 whose programs may end in the `lzma` leaf, and
# whose index digest covers the header as well. Version 6 is version 5
# whose programs may read bytes as a typed tensor (the `view` operator:
# numbers discovery finds in bytes no parser typed). Version 7 is
# version 6 whose chunks are checked with XXH3-128 instead of BLAKE3: the
# decoder checks a chunk's digest in the same call, without the GIL, that
# decodes it, while its bytes are in cache (BLAKE3 was 19 % of decoding
# pocketnet on one thread, XXH3-128 there 4 %). Version 8 is version 7
# whose gathered segments may hold tensors (`members`: small tensors of one
# dtype coded as one segment, see formats/gather.py). Version 9 is
# version 8 whose index holds each distinct program once, in a table the
# segments name by number (`programs` at the top): smollm2's index was 659
# KB of JSON, 597 KB of it the rank symbols of 12 programs written 219
# times. Every archive is written as version 9; a reader of versions 1 to
# 8 refuses it ("upgrade Brevis") rather than calling its numbered
# programs malformed.
BLAKE3_VERSION = GATHER_VERSION = 3
XXH3_DIGEST_VERSION = 7
MEMBERS_VERSION = 8  # gathered tensors
PROGRAM_TABLE_VERSION = 9  # the index's program table
HEADER_DIGEST_VERSION = 5  # the footer's digest covers the header too
DIGEST_BYTES = 16  # of a chunk's digest


def chunk_digester(version: int):
    """The digest of a chunk's original bytes in archives of this version:
    data -> its first DIGEST_BYTES bytes."""
    if version >= XXH3_DIGEST_VERSION:
        return chunk_digest
    if version >= BLAKE3_VERSION:
        return lambda data: blake3(data).digest(DIGEST_BYTES)
    return lambda data: hashlib.sha256(data).digest()[:DIGEST_BYTES]


def chunk_digest(data) -> bytes:
    """The digest of a chunk's original bytes in the archives Brevis writes
    (VERSION): XXH3-128, canonical (big-endian), as xxhash.xxh3_128_digest."""
    return _xxh3_128(data)


def stream_checker(version: int):
    """The 32-bit check of a stored stream in archives of this version: data -> int."""
    if version >= BLAKE3_VERSION:
        return stream_check
    return zlib.crc32


def stream_check(data) -> int:
    """The check of a stored stream in the archives Brevis writes (VERSION):
    the low 32 bits of its XXH3-64."""
    return _xxh3_low32(data)


HEADER = struct.Struct("<8sHHI")
FOOTER = struct.Struct("<QQQ16s8s")
HEADER_SIZE = HEADER.size
FOOTER_SIZE = FOOTER.size

# Limits a reader enforces before allocating anything an archive declares.
# The writer checks every one of them first (formats.layout stores a file
# whose tensors break them as bytes; ArchiveWriter.finish reads its own
# index back through the reader's checks before publishing).
MAX_INDEX_BYTES = 1 << 30
MAX_CHUNK_BYTES = 64 << 20
MAX_DIMS = 64  # dimensions of a tensor (numpy's limit)
# Entries (files, folders, segments, chunks) an index may list: this many,
# plus one per ENTRY_BYTES bytes of the archive. A legitimate entry costs
# 16 bytes of incompressible digest or more, unless it repeats an earlier
# chunk; so 5 million constant chunks cannot hide in an 18 KB archive.
FREE_ENTRIES = 1 << 18
ENTRY_BYTES = 8
# The same for the index's JSON, checked from the footer before it is
# decompressed: FREE_INDEX_BYTES, plus INDEX_RATIO per byte of the archive
# (an index of distinct chunks compresses about 4:1 at best, its digests
# being random; repeated chunks much better, hence the allowance, which
# holds 180,000 chunk entries), and never over MAX_INDEX_BYTES.
FREE_INDEX_BYTES = 16 << 20
INDEX_RATIO = 8


def max_entries(archive_bytes: int) -> int:
    """How many index entries an archive of this size may list."""
    return FREE_ENTRIES + archive_bytes // ENTRY_BYTES


def max_index_bytes(archive_bytes: int) -> int:
    """How many bytes of index JSON an archive of this size may declare."""
    return min(MAX_INDEX_BYTES, FREE_INDEX_BYTES + INDEX_RATIO * archive_bytes)


def shape_fits(shape, itemsize: int) -> bool:
    """Whether numpy can make an array of this shape (at most MAX_DIMS
    dimensions, and the product of the non-zero ones times the element size
    below 2^63, even when another dimension is 0)."""
    if len(shape) > MAX_DIMS:
        return False
    if min(shape, default=1) >= 1:  # most shapes: no 0 to skip, the product grows with every factor
        return math.prod(shape) * itemsize < 1 << 63
    total = itemsize
    for d in shape:
        total *= max(d, 1)
        if total >= 1 << 63:
            return False
    return True


def pack_header(version: int = VERSION) -> bytes:
    return HEADER.pack(MAGIC, version, 0, 0)


def check_header(data: bytes) -> int:
    """The format version of a header (FormatError, UnsupportedVersion)."""
    if len(data) < HEADER_SIZE:
        if MAGIC.startswith(data[: len(MAGIC)]):
            raise TruncatedError("archive ends inside its header")
        raise FormatError("not a Brevis archive (bad magic)")
    magic, version, flags, reserved = HEADER.unpack(data[:HEADER_SIZE])
    if magic != MAGIC:
        raise FormatError("not a Brevis archive (bad magic)")
    if version > VERSION:
        raise UnsupportedVersion(
            f"archive format version {version} is newer than this Brevis reads ({VERSION}); upgrade Brevis")
    if version < 1:
        raise FormatError(f"unknown archive format version {version}")
    if flags:
        raise FormatError(f"unknown header flags {flags:#x}")
    if reserved:
        raise FormatError("reserved header bytes are not zero")
    return version


def index_digest(stored_index: bytes, version: int) -> bytes:
    """The footer's digest of the stored index; from version 5 on of the
    header too, so that a damaged version field that names another valid
    version (5 -> 4, one bit) cannot pass unseen."""
    if version >= HEADER_DIGEST_VERSION:
        return hashlib.sha256(pack_header(version) + stored_index).digest()[:16]
    return hashlib.sha256(stored_index).digest()[:16]


@dataclass(frozen=True)
class Footer:
    index_offset: int
    index_length: int
    index_raw_length: int
    digest: bytes

    def pack(self) -> bytes:
        return FOOTER.pack(self.index_offset, self.index_length, self.index_raw_length,
                           self.digest, END_MAGIC)

    @staticmethod
    def unpack(data: bytes, file_size: int) -> "Footer":
        offset, length, raw, digest, magic = FOOTER.unpack(data)
        if magic != END_MAGIC:
            raise TruncatedError("archive has no footer (truncated or not finished)")
        if offset < HEADER_SIZE or offset + length + FOOTER_SIZE != file_size:
            raise FormatError("footer does not locate the index inside the archive")
        if not 0 < raw <= MAX_INDEX_BYTES:
            raise FormatError(f"index declares {raw} bytes, over the {MAX_INDEX_BYTES} limit")
        if raw > max_index_bytes(file_size):
            raise FormatError(f"index declares {raw} bytes, more than an archive of {file_size} bytes "
                              f"may hold ({max_index_bytes(file_size)})")
        return Footer(offset, length, raw, digest)
