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
import struct
from dataclasses import dataclass

from ..errors import FormatError, TruncatedError, UnsupportedVersion

MAGIC = b"\x89BRV\r\n\x1a\n"
END_MAGIC = b"BRVINDEX"
VERSION = 1
HEADER = struct.Struct("<8sHHI")
FOOTER = struct.Struct("<QQQ16s8s")
HEADER_SIZE = HEADER.size
FOOTER_SIZE = FOOTER.size

# Limits a reader enforces before allocating anything an archive declares.
MAX_INDEX_BYTES = 1 << 30
MAX_CHUNK_BYTES = 64 << 20


def pack_header() -> bytes:
    return HEADER.pack(MAGIC, VERSION, 0, 0)


def check_header(data: bytes) -> None:
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
    if version != VERSION:
        raise FormatError(f"unknown archive format version {version}")
    if flags:
        raise FormatError(f"unknown header flags {flags:#x}")
    if reserved:
        raise FormatError("reserved header bytes are not zero")


def index_digest(stored_index: bytes) -> bytes:
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
        return Footer(offset, length, raw, digest)
