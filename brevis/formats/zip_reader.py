"""A zip reader for checkpoints: the central directory, local headers, members' bytes.

Not zipfile, so that every offset is checked against the file (a ParseError
otherwise) and a STORED member's data start is known: that is where a tensor
segment begins. Zip64 end records and extra fields are followed; DEFLATED
members can be read (pickles), other methods cannot.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import BinaryIO

from . import ParseError

MAX_DIRECTORY = 128 << 20  # bytes of zip central directory


# Built once per member: a slotted dataclass, as a frozen one takes three times as long to build.
@dataclass(slots=True)
class Member:
    """One central directory entry, zip64 sizes resolved."""

    name: str
    method: int
    csize: int
    usize: int
    header: int  # local header offset


def read_at(f: BinaryIO, offset: int, n: int, size: int) -> bytes:
    """Exactly n bytes at offset; ParseError if they are not all within the file's size."""
    if offset < 0 or n < 0 or offset + n > size:
        raise ParseError("read past the end of the file")
    f.seek(offset)
    data = f.read(n)
    if len(data) != n:
        raise ParseError("file shorter than its size")
    return data


def central_directory(f: BinaryIO, size: int) -> list[Member]:
    """The members the end of central directory (zip64 included) lists, in its order."""
    tail_len = min(size, 22 + 0xFFFF)
    tail = read_at(f, size - tail_len, tail_len, size)
    eocd = -1
    i = tail.rfind(b"PK\x05\x06")
    while i >= 0:
        if i + 22 <= len(tail):
            (clen,) = struct.unpack_from("<H", tail, i + 20)
            if i + 22 + clen == len(tail):
                eocd = i
                break
        i = tail.rfind(b"PK\x05\x06", 0, i)
    if eocd < 0:
        raise ParseError("no zip end of central directory")
    _, _, _, count, cd_size, cd_offset, _ = struct.unpack_from("<HHHHIIH", tail, eocd + 4)
    eocd_at = size - tail_len + eocd
    if count == 0xFFFF or cd_size == 0xFFFFFFFF or cd_offset == 0xFFFFFFFF:
        loc = read_at(f, eocd_at - 20, 20, size)
        if loc[:4] != b"PK\x06\x07":
            raise ParseError("zip64 locator missing")
        (z64_at,) = struct.unpack_from("<Q", loc, 8)
        z64 = read_at(f, z64_at, 56, size)
        if z64[:4] != b"PK\x06\x06":
            raise ParseError("zip64 end of central directory missing")
        count, cd_size, cd_offset = struct.unpack_from("<QQQ", z64, 32)
    if cd_offset + cd_size > size or count > cd_size // 46:
        raise ParseError("zip central directory leaves the file")
    if cd_size > MAX_DIRECTORY:
        raise ParseError("zip central directory too large")
    cd = read_at(f, cd_offset, cd_size, size)
    members = []
    p = 0
    for _ in range(count):
        if cd[p:p + 4] != b"PK\x01\x02" or p + 46 > len(cd):
            raise ParseError("bad zip central directory entry")
        (method, csize, usize, nlen, elen, clen, header) = struct.unpack_from("<10xH8xIIHHH8xI", cd, p)
        name_b = cd[p + 46:p + 46 + nlen]
        extra = cd[p + 46 + nlen:p + 46 + nlen + elen]
        p += 46 + nlen + elen + clen
        if p > len(cd):
            raise ParseError("zip central directory entry leaves the directory")
        if 0xFFFFFFFF in (csize, usize, header):
            usize, csize, header = _zip64_extra(extra, usize, csize, header)
        members.append(Member(name_b.decode("utf-8", "replace"), method, csize, usize, header))
    return members


def _zip64_extra(extra: bytes, usize: int, csize: int, header: int) -> tuple[int, int, int]:
    q = 0
    while q + 4 <= len(extra):
        tag, n = struct.unpack_from("<HH", extra, q)
        body = extra[q + 4:q + 4 + n]
        q += 4 + n
        if tag != 1:
            continue
        vals = [v for v in struct.unpack_from(f"<{len(body) // 8}Q", body)] if len(body) >= 8 else []
        it = iter(vals)
        try:
            if usize == 0xFFFFFFFF:
                usize = next(it)
            if csize == 0xFFFFFFFF:
                csize = next(it)
            if header == 0xFFFFFFFF:
                header = next(it)
        except StopIteration:
            raise ParseError("short zip64 extra field") from None
        return usize, csize, header
    raise ParseError("zip64 sizes without a zip64 extra field")


def data_start(f: BinaryIO, m: Member, size: int) -> int:
    """The file offset of the member's data, after its local header."""
    lh = read_at(f, m.header, 30, size)
    if lh[:4] != b"PK\x03\x04":
        raise ParseError(f"bad local header for {m.name!r}")
    nlen, elen = struct.unpack_from("<HH", lh, 26)
    start = m.header + 30 + nlen + elen
    if start + m.csize > size:
        raise ParseError(f"zip member {m.name!r} leaves the file")
    return start


def member_bytes(f: BinaryIO, m: Member, size: int, limit: int) -> bytes:
    """The member's contents, STORED or DEFLATED; ParseError beyond `limit` bytes."""
    if m.usize > limit:
        raise ParseError(f"{m.name!r} is too large to read")
    raw = read_at(f, data_start(f, m, size), m.csize, size)
    if m.method == 0:
        if m.csize != m.usize:
            raise ParseError(f"stored member {m.name!r} has two sizes")
        return raw
    if m.method != 8:
        raise ParseError(f"{m.name!r} uses compression method {m.method}")
    d = zlib.decompressobj(-15)
    out = d.decompress(raw, m.usize + 1)
    if len(out) != m.usize:
        raise ParseError(f"{m.name!r} inflates to the wrong size")
    return out
