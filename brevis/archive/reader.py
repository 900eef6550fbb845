"""Reading an archive: validate header, footer and index, then decode chunks.

Streams are read with pread, so one reader serves many threads; an archive
already in memory (bytes, bytearray, mmap) is read in place, as views of it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import zstandard

from ..dsl.coders import thread_decompressor
from ..dsl.entropy import batchable, decode_batch, narrow
from ..dsl.interpreter import decode, leaves_ahead
from ..errors import BrevisError, ChecksumError, FormatError, InvalidArgument, IOFailure, TruncatedError
from .format import (FOOTER_SIZE, HEADER_SIZE, Footer, check_header, chunk_digest, chunk_digester, index_digest, max_entries,
                     stream_check, stream_checker)
from .index import Chunk, Index, SegmentEntry
from .schema import paused_gc


# The last index parsed, by its footer (which holds the SHA-256 of the stored
# index): the same archive opened again in this process, or in a worker
# process forked after it was opened, skips decompressing, parsing and
# checking its index again (24 ms for pocketnet-v3's 1,100 tensors). Only
# for indexes up to CACHED_INDEX_BYTES of JSON, so little is kept alive.
CACHED_INDEX_BYTES = 16 << 20
# read_runs: the most stored bytes one pread brings in for a run of chunks
# (a job's chunks: 1 MiB of original bytes on threads, 4 MiB in workers).
READ_RUN_BYTES = 8 << 20
# decode_chunks: the most bytes of leaves decoded ahead in one call (a job's
# chunks': about as many bytes as the chunks); the rest decode as usual.
AHEAD_BYTES = 8 << 20
_last_index: tuple[Footer, Index] | None = None


def count_entries(index: Index) -> int:
    """Files, folders, segments and chunks: what format.max_entries bounds."""
    return len(index.files) + len(index.dirs) + len(getattr(index, "links", ())) + sum(
        len(f.segments) + sum(len(s.chunks) for s in f.segments) for f in index.files)


MEMORY = Path("<memory>")  # the path an archive held in memory goes by in messages


class ArchiveReader:
    """An archive's index, and its chunks decoded and checked. `data`: the
    archive's bytes, held in memory by the caller (any contiguous buffer),
    read without a copy; `path` then only names it in messages.
    `unchecked(value)`: called with the index's JSON value as parsed,
    before its checks (where the index is read, not found read already):
    work the checked index will confirm may start there, trusting nothing
    in it."""

    def __init__(self, path: Path, data=None, unchecked=None):
        self.path = Path(path)
        self._unchecked = unchecked
        self.on_close: list = []  # callbacks run when the reader closes
        self.buffer: memoryview | None = None
        self.fd = -1
        if data is not None:
            try:
                self.buffer = memoryview(data).cast("B").toreadonly()  # nothing here writes the archive
            except TypeError:
                raise InvalidArgument(f"{self.path}: an archive in memory must be a contiguous bytes-like object") from None
            self.size = len(self.buffer)
            self.index = self._read_index()
            return
        try:
            self.fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            raise InvalidArgument(f"{self.path}: no such archive") from None
        except IsADirectoryError:
            raise InvalidArgument(f"{self.path} is a folder, not an archive") from None
        except OSError as e:
            raise IOFailure(f"cannot open {self.path}: {e.strerror}") from None
        try:
            self.size = os.fstat(self.fd).st_size
            self.index = self._read_index()
        except BaseException:
            os.close(self.fd)
            raise

    def _read_index(self) -> Index:
        self.version = check_header(bytes(self.read(0, min(self.size, HEADER_SIZE), allow_short=True)))
        self.chunk_digest = chunk_digester(self.version)
        self.stream_check = stream_checker(self.version)
        if self.size < HEADER_SIZE + FOOTER_SIZE:
            raise TruncatedError("archive ends before its footer")
        self.footer = Footer.unpack(bytes(self.read(self.size - FOOTER_SIZE, FOOTER_SIZE)), self.size)
        stored = self.read(self.footer.index_offset, self.footer.index_length)
        if index_digest(stored, self.version) != self.footer.digest:
            raise FormatError("index checksum mismatch")
        global _last_index
        if _last_index is not None and _last_index[0] == self.footer:
            return _last_index[1]  # same stored index at the same place: the same checks passed
        try:
            raw = thread_decompressor().decompress(stored, max_output_size=self.footer.index_raw_length)
        except zstandard.ZstdError as e:
            raise FormatError(f"index does not decompress: {e}") from None
        if len(raw) != self.footer.index_raw_length:
            raise FormatError("index has the wrong length")
        with paused_gc():  # tens of thousands of objects, none in a cycle
            try:
                obj = json.loads(raw.decode("ascii"))
            except (UnicodeDecodeError, ValueError, RecursionError):
                raise FormatError("index is not valid JSON") from None
            if self._unchecked is not None:
                self._unchecked(obj)
            index = Index.from_json(obj, HEADER_SIZE, self.footer.index_offset)
            # Freed while collections are off, the JSON value's objects leave
            # the young generation's count: the collection that follows
            # scans the index's objects only, not theirs too.
            del obj
            entries = count_entries(index)
            if entries > max_entries(self.size):
                raise FormatError(f"index lists {entries} entries, more than an archive of {self.size} bytes "
                                  f"may hold ({max_entries(self.size)})")
        if self.footer.index_raw_length <= CACHED_INDEX_BYTES:
            _last_index = (self.footer, index)
        return index

    @property
    def checks_in_call(self) -> bool:
        """Whether decode_streams makes this archive's checks, its streams'
        and its chunks' (format version 7 on: the checks Brevis writes)."""
        return self.stream_check is stream_check and self.chunk_digest is chunk_digest

    @property
    def in_memory(self) -> bool:
        return self.buffer is not None

    def read(self, offset: int, length: int, allow_short: bool = False) -> bytes | memoryview:
        """`length` bytes from `offset` (fewer, where allow_short, at the end);
        of an archive in memory, a view of them."""
        if self.buffer is not None:
            if offset < 0 or length < 0 or (offset + length > self.size and not allow_short):
                raise TruncatedError(f"archive ends at {self.size}, inside a stream")
            return self.buffer[offset: offset + length]
        try:
            data = os.pread(self.fd, length, offset)
        except OSError as e:
            raise IOFailure(f"cannot read {self.path}: {e.strerror}") from None
        while len(data) < length:  # pread may return less than asked
            try:
                more = os.pread(self.fd, length - len(data), offset + len(data))
            except OSError as e:
                raise IOFailure(f"cannot read {self.path}: {e.strerror}") from None
            if not more:
                if allow_short:
                    break
                raise TruncatedError(f"archive ends at {offset + len(data)}, inside a stream")
            data += more
        return data

    def decode_chunk(self, seg: SegmentEntry, chunk: Chunk, reference: np.ndarray | None = None,
                     into: np.ndarray | None = None, stored: list[memoryview] | None = None,
                     streams_first: bool = False, ready: dict | None = None) -> np.ndarray:
        """The original bytes of one chunk (uint8), checked against its digest.

        `reference`: the base tensor's elements at the chunk's positions, for
        a chunk coded against a base. `into`: a writable uint8 array of the
        chunk's length to decode into (returned; its bytes are undefined if
        this raises). `stored`: the chunk's streams, read already (read_runs).
        `streams_first`: each stream's check made before decoding (verify),
        else only where the chunk fails, to tell a damaged stream
        as such: its digest guards every byte it gives back. `ready`: its
        leaves decoded ahead (interpreter.decode's)."""
        streams = self._stored(chunk.streams) if stored is None else stored
        if streams_first:
            self._check_streams(seg, chunk, streams)
        target = self._target(seg, chunk, into)
        try:
            try:
                values = decode(seg.programs[chunk.program], seg.value_type, chunk.n, streams, reference, target, ready)
            except BrevisError:
                raise
            except (ValueError, TypeError, IndexError, OverflowError, MemoryError) as e:
                raise FormatError(f"segment {seg.name!r}{seg.holding()}: a stream does not decode ({e})") from None
            data = values.view(np.uint8) if into is None else into
            self._check_digest(seg, chunk, data)
        except BrevisError:
            if not streams_first:
                self._check_streams(seg, chunk, streams)  # a damaged stream is told as such
            raise
        return data

    def _check_streams(self, seg: SegmentEntry, chunk: Chunk, streams: list[memoryview]) -> None:
        """ChecksumError naming the first of a chunk's streams that does not match its check."""
        for k, ((off, _, crc), data) in enumerate(zip(chunk.streams, streams)):
            if self.stream_check(data) != crc:
                raise ChecksumError(f"segment {seg.name!r}{seg.holding()}: stream {k} at offset {off} is damaged")

    @staticmethod
    def _target(seg: SegmentEntry, chunk: Chunk, into) -> np.ndarray | None:
        """`into` (a chunk's uint8 bytes) as the segment's values, or None without it."""
        if into is None:
            return None
        if len(into) != chunk.n * seg.itemsize:
            raise ValueError("decode_chunk: `into` is not the chunk's length")
        return into.view(seg.value_type.container)

    def _check_digest(self, seg: SegmentEntry, chunk: Chunk, data) -> None:
        if self.chunk_digest(data) != chunk.digest:
            raise ChecksumError(f"segment {seg.name!r}{seg.holding()}: decoded bytes do not match their checksum")

    def decode_chunks(self, items, streams_first: bool = False) -> list[np.ndarray]:
        """decode_chunk for each (segment, chunk, reference, into, stored) in
        order, raising at the first damaged one (without `streams_first`,
        among a batch's: the first that does not decode, else the first
        whose digest differs). The chunks that one `ans`
        leaf codes (without a base) decode in one call that releases the GIL
        once (entropy.decode_batch), those decoded on their own between them
        (a bias stored raw) leaving it open: decoding threads otherwise hand
        the GIL over at every small chunk (taesd, 2 threads, warm: 9.2 ->
        7.1 ms with the batch left open). That call checks its chunks'
        digests too (format version 7 on), and their streams' checks where
        `streams_first` (format version 3 on; else a failing chunk's, as
        decode_chunk)."""
        out: list = []
        batch: list = []  # (position in out, segment, chunk, stream, target, into) awaiting decoding
        digest, check = self.chunk_digest, self.stream_check
        # decode_streams makes the checks of the archives Brevis writes (format
        # version 3 on for streams, 7 on for chunks); older ones are made here.
        streams_in_call, digests_in_call = check is stream_check, digest is chunk_digest

        def flush() -> None:
            if not batch:
                return
            checks = [(chunk.streams[0][2] if streams_in_call and streams_first else -1,
                       chunk.digest if digests_in_call else None)
                      for _, _, chunk, _, _, _ in batch]
            try:
                decode_batch([(stream, chunk.n, seg.value_type, target) for _, seg, chunk, stream, target, _ in batch],
                             checks)
                failed = None
            except FormatError as e:
                failed = e
            if failed is not None:  # (kind 1, its stream's check failed in the call, is told here too)
                seg, chunk, stream = batch[failed.position][1:4]
                self._check_streams(seg, chunk, [stream])  # a damaged stream is told as such
                told = f"segment {seg.name!r}{seg.holding()}"
                if failed.kind == 2:
                    raise ChecksumError(f"{told}: decoded bytes do not match their checksum")
                raise FormatError(f"{told}: a stream does not decode ({failed})")
            for pos, seg, chunk, stream, target, into in batch:
                data = target.view(np.uint8) if into is None else into
                if not digests_in_call and digest(data) != chunk.digest:
                    self._check_streams(seg, chunk, [stream])
                    self._check_digest(seg, chunk, data)
                out[pos] = data
            batch.clear()

        ahead = self._decode_ahead(items, streams_first and streams_in_call)
        # The common case inline (one stream, one `ans` leaf): the same checks
        # as decode_chunk's, at a fraction of its calls per chunk.
        for k, (seg, chunk, reference, into, stored) in enumerate(items):
            program = seg.programs[chunk.program]
            t = seg.value_type
            target = self._target(seg, chunk, into)
            if (reference is None and chunk.n and not program.children and len(chunk.streams) == 1
                    and batchable(program.node, t, target)):
                stream = self._stored(chunk.streams)[0] if stored is None else stored[0]
                if streams_first and not streams_in_call:
                    self._check_streams(seg, chunk, [stream])
                target = np.empty(chunk.n, t.container) if target is None else target
                batch.append((len(out), seg, chunk, stream, target, into))
                out.append(None)
                continue
            # Decoded now, the batch left open (a model's small chunks, e.g. biases
            # stored raw, sit between the large ones): where this one is damaged,
            # the batch is decoded first, so that the first damaged chunk is told.
            try:
                data = self.decode_chunk(seg, chunk, reference, into, stored, streams_first,
                                         ahead[k] if ahead else None)
            except BrevisError:
                flush()
                raise
            out.append(data)
        flush()
        return out

    def _decode_ahead(self, items, checked: bool) -> list | None:
        """For each of decode_chunks' items, its leaves decoded ahead
        (interpreter.leaves_ahead) as {stream position: values}, or None:
        those of the chunks the interpreter decodes (not one leaf alone),
        up to AHEAD_BYTES of them, in one call (entropy.decode_batch),
        where the engine of narrow blocks interleaves many chunks' blocks
        (a Q4_1 chunk's scales and quants: four or five leaves of a few
        thousand values each, decoded a chunk's at a time or alone before).
        Leaves of wide blocks are left to their chunk, decoded where their
        parent takes them while they are in cache (nomic's F16 chunks,
        each one transposed leaf of 1 MiB, two to a window).
        `checked`: each stream's check made in the call. None where there
        are none, or where one fails: the chunks then decode as usual,
        which names what is damaged."""
        out: list = [None] * len(items)
        batch, checks, budget = [], [], AHEAD_BYTES
        for k, (seg, chunk, _, _, stored) in enumerate(items):
            program = seg.programs[chunk.program]
            if not program.children or not chunk.n or stored is None:
                continue
            ready = {}
            for at, n, t in leaves_ahead(program, seg.value_type, chunk.n):
                size = n * t.container.itemsize
                if size > budget or at >= len(stored) or not narrow(stored[at]):
                    continue
                budget -= size
                ready[at] = values = np.empty(n, t.container)
                batch.append((stored[at], n, t, values))
                checks.append((chunk.streams[at][2] if checked else -1, None))
            out[k] = ready or None
        if not batch:
            return None
        try:
            decode_batch(batch, checks)
        except FormatError:
            return None
        return out

    def read_runs(self, chunks: list[Chunk], most: int = READ_RUN_BYTES) -> list[list[memoryview]]:
        """The stored streams of each of these chunks, as _stored gives them,
        read with one pread per run of streams that lie back to back in the
        archive (the usual case for a file's consecutive chunks), a run
        holding at most `most` bytes unless one stream is longer."""
        if self.buffer is not None:  # in memory: views, nothing to read or group
            return [self._stored(c.streams) for c in chunks]
        out: list[list[memoryview]] = []
        run: list[Chunk] = []
        first = end = 0

        def flush() -> None:
            if not run:
                return
            whole = memoryview(self.read(first, end - first))
            out.extend([whole[off - first:off - first + n] for off, n, _ in c.streams] for c in run)
            run.clear()

        for c in chunks:
            if not c.streams:
                flush()
                out.append([])
                continue
            lo = c.streams[0][0]
            hi = c.streams[-1][0] + c.streams[-1][1]
            contiguous = all(a[0] + a[1] == b[0] for a, b in zip(c.streams, c.streams[1:]))
            if not contiguous:
                flush()
                out.append(self._stored(c.streams))
                continue
            if run and (lo != end or hi - first > most):
                flush()
            if not run:
                first = lo
            run.append(c)
            end = hi
        flush()
        return out

    def _stored(self, located: list[tuple[int, int, int]]) -> list[memoryview]:
        """The stored bytes of streams; those written back to back (the usual
        case) with one read, which saves a system call and a buffer each. Of
        an archive in memory, a view of each (the index checked where they lie)."""
        if self.buffer is not None:
            buffer = self.buffer
            return [buffer[off:off + length] for off, length, _ in located]
        if len(located) > 1 and all(a[0] + a[1] == b[0] for a, b in zip(located, located[1:])):
            first = located[0][0]
            whole = memoryview(self.read(first, located[-1][0] + located[-1][1] - first))
            return [whole[off - first:off - first + length] for off, length, _ in located]
        return [memoryview(self.read(off, length)) for off, length, _ in located]

    def close(self) -> None:
        while self.on_close:
            self.on_close.pop()()
        self.buffer = None  # views of it handed out keep the caller's bytes alive
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "ArchiveReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
