"""The index schema: both directions from one description, and the docs from it too."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from brevis.archive import schema
from brevis.archive.format import HEADER_SIZE, PROGRAM_TABLE_VERSION, VERSION
from brevis.archive.index import INDEX, Index
from brevis.archive.reader import ArchiveReader
from brevis.archive.schema import SearchKind, search_kind
from brevis.codec.encoder import compress
from brevis.errors import FormatError
from helpers import inline_programs

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "v1" / "archive.brv"
SOURCES = {"taesd": ROOT / "examples" / "taesd", "golden-source": ROOT / "tests" / "golden" / "v1" / "source"}


def _raw_index(reader: ArchiveReader) -> bytes:
    import zstandard

    f = reader.footer
    return zstandard.ZstdDecompressor().decompress(reader.read(f.index_offset, f.index_length),
                                                   max_output_size=f.index_raw_length)


def _round_trip(path: Path, written: Index | None = None, same_bytes: bool = True) -> None:
    with ArchiveReader(path) as reader:
        index = reader.index
        raw = _raw_index(reader)
        end = reader.footer.index_offset
    if same_bytes:  # the JSON the writer stored is what to_json makes of what was read
        assert json.dumps(index.to_json(), separators=(",", ":")).encode("ascii") == raw
    again = Index.from_json(json.loads(json.dumps(index.to_json())), HEADER_SIZE, end)
    assert again == index
    assert Index.from_json(index.to_json(), HEADER_SIZE, end) == index
    if written is not None:  # the writer's own index, before it went through JSON
        assert Index.from_json(json.loads(json.dumps(written.to_json())), HEADER_SIZE, end) == written


@pytest.fixture(scope="module", params=sorted(SOURCES))
def archive(request, tmp_path_factory) -> Path:
    source = SOURCES[request.param]
    if not source.exists():
        pytest.skip(f"{source} is missing")
    out = tmp_path_factory.mktemp("index") / f"{request.param}.brv"
    compress([source], out, threads=1)
    return out


def test_round_trip(archive):
    _round_trip(archive)


def test_round_trip_golden():
    # Written before segments had "base" (absent reads as null, written as null).
    _round_trip(GOLDEN, same_bytes=False)


def test_each_program_is_written_once(archive):
    """The program table (format version 9) holds each distinct program once,
    segments name theirs by number; the same index written as versions 1 to
    8 wrote it (programs in their segments, no table) reads the same."""
    with ArchiveReader(archive) as reader:
        index, obj, end = reader.index, json.loads(_raw_index(reader)), reader.footer.index_offset
        assert reader.version == VERSION >= PROGRAM_TABLE_VERSION
    table = obj["programs"]
    assert list(obj).index("programs") < list(obj).index("files")
    texts = [json.dumps(p) for p in table]
    assert len(set(texts)) == len(texts)
    named = [k for f in obj["files"] for s in f["segments"] for k in s["programs"]]
    assert all(type(k) is int for k in named) and set(named) == set(range(len(table)))
    assert len(named) > len(table)  # segments share programs: the table saves their repeats
    inline = json.loads(json.dumps(obj))
    inline_programs(inline)
    assert Index.from_json(inline, HEADER_SIZE, end) == index
    assert len(json.dumps(obj)) < len(json.dumps(inline))


def test_round_trip_of_the_writers_index(tmp_path, monkeypatch):
    """The index as the encoder built it (search kinds as enums, streams as
    tuples) equals the one read back."""
    from brevis.archive import writer

    seen = []
    finish = writer.ArchiveWriter.finish

    def keep(self, index):
        seen.append(index)
        return finish(self, index)

    monkeypatch.setattr(writer.ArchiveWriter, "finish", keep)
    out = tmp_path / "g.brv"
    compress([SOURCES["golden-source"]], out, threads=1)
    _round_trip(out, seen[0])
    kinds = {search_kind(s.search) for f in seen[0].files for s in f.segments if s.search}
    assert kinds and None not in kinds


def test_search_kinds_are_the_stored_strings():
    assert [k.value for k in SearchKind] == ["tiny", "none", "a*", "learned", "family"]
    assert json.dumps({"search": SearchKind.SEARCH}) == '{"search": "a*"}'
    assert search_kind({"search": "family"}) is SearchKind.FAMILY
    assert search_kind({"search": "something newer"}) is None
    assert search_kind({"search": [1]}) is None
    assert search_kind({}) is None


def test_every_field_is_required_or_defaulted():
    """Each record's JSON keys are distinct; array records' positions are 0..n-1."""
    for r in schema._records(INDEX, []):
        keys = [f.key for f in r.fields]
        assert len(set(keys)) == len(keys), r.name
        if r.array:
            assert keys == list(range(len(keys))), r.name


@pytest.mark.parametrize("edit, message", [
    (lambda o: o.pop("files"), "index lacks 'files'"),
    (lambda o: o.update(created_by=1), "'created_by' has the wrong type"),
    (lambda o: o.update(prior=[]), "prior must be an object"),
    (lambda o: o.update(base={"sha256": "00"}), "base must be an object"),
    (lambda o: o["dirs"].append("../x"), "unsafe path"),
    (lambda o: o["files"][0].pop("size"), "lacks 'size'"),
    (lambda o: o["files"][0].update(size=-1), "do not add up to the file size"),
    (lambda o: o["files"][0]["segments"][0].update(dtype="F33"), "unknown dtype 'F33'"),
    (lambda o: o["files"][0]["segments"][0].update(search=[]), "search must be an object"),
    (lambda o: o["files"][0]["segments"][0]["chunks"][0].__setitem__(0, 99), "names no program"),
    (lambda o: o["files"][0]["segments"][0]["chunks"][0].__setitem__(1, True), "out of bounds"),
    (lambda o: o["files"][0]["segments"][0]["chunks"][0].__setitem__(3, "zz"), "malformed checksum"),
    (lambda o: o["files"][0]["segments"][0]["chunks"][0][2][0].__setitem__(2, 1 << 32), "stream checksum"),
    (lambda o: o["files"][0]["segments"][0]["chunks"][0][2][0].__setitem__(0, 0), "outside the stream region"),
    (lambda o: o["files"][0]["segments"][0]["chunks"][0][2].append([16, 0, 0]), "wrong number of streams"),
    (lambda o: o["files"][0]["segments"][0]["chunks"][0][2][0].__setitem__(1, 1.0), "malformed stream location"),
])
def test_damaged_fields_are_refused(edit, message):
    with ArchiveReader(GOLDEN) as reader:
        obj = json.loads(_raw_index(reader))
        end = reader.footer.index_offset
    Index.from_json(obj, HEADER_SIZE, end)
    edit(obj)
    with pytest.raises(FormatError, match=re.escape(message)):
        Index.from_json(obj, HEADER_SIZE, end)


def test_format_md_tables_are_the_schema():
    """docs/FORMAT.md's field tables are generated from the schema
    (`python -m brevis.archive.schema --write docs/FORMAT.md`)."""
    doc = (ROOT / "docs" / "FORMAT.md").read_text()
    begin, end = schema.DOC_BEGIN, schema.DOC_END
    assert begin in doc and end in doc
    assert doc[doc.index(begin) + len(begin):doc.index(end)].strip() == schema.markdown(INDEX).strip()
