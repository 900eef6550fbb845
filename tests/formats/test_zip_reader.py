"""The zip reader of PyTorch checkpoints, against the standard library's zipfile."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib

import pytest

from brevis.formats import ParseError
from brevis.formats.zip_reader import central_directory, data_start, member_bytes, read_at


def sample_zip(comment: bytes = b"") -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("a/data.pkl", b"\x80\x02}q\x00." * 50, zipfile.ZIP_DEFLATED)
        info = zipfile.ZipInfo("a/data/0")
        info.extra = struct.pack("<HH", 0x4246, 5) + b"Z" * 5  # an extra field before the data
        z.writestr(info, bytes(range(256)) * 4)
        z.writestr("a/empty", b"")
        z.comment = comment
    return buf.getvalue()


def zip64(body: bytes, name: bytes = b"m/data/0") -> bytes:
    """One STORED member whose sizes and offset are in zip64 fields: the central directory
    entry's extra field, and the zip64 end of central directory record and locator."""
    crc = zlib.crc32(body)
    local = struct.pack("<4s5H3I2H", b"PK\x03\x04", 45, 0, 0, 0, 0, crc, len(body), len(body), len(name), 0)
    extra = struct.pack("<HH3Q", 1, 24, len(body), len(body), 0)
    entry = (struct.pack("<4s6H3I5H2I", b"PK\x01\x02", 45, 45, 0, 0, 0, 0, crc, 0xFFFFFFFF, 0xFFFFFFFF,
                         len(name), len(extra), 0, 0, 0, 0, 0xFFFFFFFF) + name + extra)
    cd_at = len(local) + len(name) + len(body)
    z64_at = cd_at + len(entry)
    end64 = struct.pack("<4sQ2H2I4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, 1, 1, len(entry), cd_at)
    locator = struct.pack("<4sIQI", b"PK\x06\x07", 0, z64_at, 1)
    end = struct.pack("<4s4H2IH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return local + name + body + entry + end64 + locator + end


@pytest.mark.parametrize("data", [sample_zip(), sample_zip(b"a comment"), zip64(b"\x01\x02" * 100)],
                         ids=["plain", "comment", "zip64"])
def test_members_agree_with_zipfile(data):
    members = central_directory(io.BytesIO(data), len(data))
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        infos = z.infolist()
        assert [(m.name, m.method, m.csize, m.usize, m.header) for m in members] == [
            (i.filename, i.compress_type, i.compress_size, i.file_size, i.header_offset) for i in infos]
        for m, i in zip(members, infos):
            assert member_bytes(io.BytesIO(data), m, len(data), 1 << 20) == z.read(i)
            if m.method == zipfile.ZIP_STORED:
                start = data_start(io.BytesIO(data), m, len(data))
                assert data[start:start + m.csize] == z.read(i)


def test_end_record_signature_in_the_comment():
    # zipfile takes the last signature for the end record; the one whose comment length ends the file is
    plain, tricky = sample_zip(b"x" * 34), sample_zip(b"PK\x05\x06" + b"x" * 30)
    assert central_directory(io.BytesIO(tricky), len(tricky)) == central_directory(io.BytesIO(plain), len(plain))


def test_member_limits_and_methods():
    data = sample_zip()
    f = io.BytesIO(data)
    pkl, stored, _ = central_directory(f, len(data))
    with pytest.raises(ParseError, match="too large"):
        member_bytes(f, stored, len(data), stored.usize - 1)
    assert len(member_bytes(f, stored, len(data), stored.usize)) == stored.usize
    pkl.method = 12  # bzip2: not read
    with pytest.raises(ParseError, match="compression method"):
        member_bytes(f, pkl, len(data), 1 << 20)


def test_truncated_and_short_reads():
    data = sample_zip()
    for n in (0, 10, len(data) - 5, len(data) - 22 - 1):
        with pytest.raises(ParseError):
            central_directory(io.BytesIO(data[:n]), n)
    with pytest.raises(ParseError, match="past the end"):
        read_at(io.BytesIO(data), len(data) - 4, 5, len(data))
    with pytest.raises(ParseError, match="shorter"):
        read_at(io.BytesIO(data[:100]), 90, 20, len(data))  # the file is shorter than it was said to be
    assert read_at(io.BytesIO(data), 4, 4, len(data)) == data[4:8]
