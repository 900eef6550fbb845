"""File formats: cut a file into segments (tensors and byte spans).

A layout is a list of segments that tile the file exactly, in order. A
tensor segment carries its dtype and shape so that programs can use the
element structure; a byte segment is opaque. Rebuilding a file is writing
its segments back to back, so any layout is lossless; parsing only has to
be right about where tensors are to help the ratio. A file that fails to
parse becomes one byte segment.
"""

from __future__ import annotations

import os

import math
from dataclasses import dataclass
from typing import BinaryIO

from ..dtypes import DType


@dataclass(frozen=True)
class Segment:
    offset: int
    length: int
    name: str = ""
    dtype: DType | None = None  # None: opaque bytes
    shape: tuple[int, ...] | None = None
    # For a byte segment of fixed-size records (GGUF quantized blocks): the
    # [count, width] of each field, as the `records` operator takes them.
    records: tuple[tuple[int, int], ...] | None = None
    # For a gathered segment (formats/gather.py): the (offset, length)
    # spans of the file it holds, one after another; `offset` is the first's.
    ranges: tuple[tuple[int, int], ...] | None = None
    # For gathered tensors (a typed gathered segment): each span's tensor,
    # (name, shape), in the order of `ranges`.
    members: tuple[tuple[str, tuple[int, ...]], ...] | None = None
    # A repeated region's number (formats/repeats.py): byte segments with
    # one number hold the same bytes, so they share one plan.
    region: int | None = None
    # False where discovery measured LZMA losing on the span this piece of
    # bytes was cut from (synth/planner.py, lzma_wins): it is not tried again.
    lzma: bool = True

    @property
    def end(self) -> int:
        return self.offset + self.length

    @property
    def start(self) -> int:
        """Where reads of its value begin: its offset in the file, or 0 in a
        gathered segment's spans (read through `ranges`)."""
        return self.offset if self.ranges is None else 0


class ParseError(Exception):
    """This file is not (well-formed) in the format tried; store it as bytes."""


def opaque(size: int, name: str = "") -> list[Segment]:
    return [Segment(0, size, name)] if size else []


def fill_gaps(tensors: list[Segment], start: int, size: int) -> list[Segment]:
    """Tile [0, size): header bytes before `start`, tensors, bytes between them.

    Raises ParseError if tensors overlap or leave the file.
    """
    out: list[Segment] = [Segment(0, start, "__header__")] if start else []
    pos = start
    for seg in sorted(tensors, key=lambda s: (s.offset, s.length)):
        if not seg.length:  # an empty tensor owns no bytes; keep it listed
            if seg.offset > size:
                raise ParseError(f"tensor {seg.name!r} leaves the file")
            out.append(Segment(pos, 0, seg.name, seg.dtype, seg.shape))
            continue
        if seg.offset < pos or seg.end > size:
            raise ParseError(f"tensor {seg.name!r} overlaps another or leaves the file")
        if seg.offset > pos:
            out.append(Segment(pos, seg.offset - pos, "__gap__"))
        out.append(seg)
        pos = seg.end
    if pos < size:
        out.append(Segment(pos, size - pos, "__trailer__"))
    return out


def parsers_enabled() -> bool:
    """False where BREVIS_PARSERS=off: every file is then cut as no parser
    knew it (the test of how far discovery alone goes, issue 13)."""
    return os.environ.get("BREVIS_PARSERS", "on").lower() not in ("off", "0", "no")


def layout(f: BinaryIO, size: int, name: str) -> tuple[str, list[Segment]]:
    """The format's name and the segments of a file; opaque if nothing parses."""
    from . import discovery, gguf, numpy_files, onnx, pytorch, safetensors

    for fmt in (safetensors, gguf, numpy_files, pytorch, onnx) if parsers_enabled() else ():
        if fmt.detect(f, size, name):
            try:
                segments = fmt.parse(f, size)
            except ParseError:
                break
            if all(readable(s) for s in segments):
                return fmt.NAME, segments
            break  # a tensor an archive reader would refuse: the whole file as bytes
    return "bytes", discovery.cut(f, size)


def readable(seg: Segment) -> bool:
    """Whether a reader accepts this segment as a tensor: the archive
    reader's limits on a shape (archive.format.shape_fits), checked here
    first so that a file breaking them is stored as bytes."""
    from ..archive.format import shape_fits

    if seg.dtype is None:
        return seg.shape is None
    shape = seg.shape
    return (isinstance(shape, (tuple, list)) and all(isinstance(d, int) and d >= 0 for d in shape)
            and shape_fits(shape, seg.dtype.itemsize) and math.prod(shape) * seg.dtype.itemsize == seg.length)
