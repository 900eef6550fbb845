"""Symbolic links inside the archived tree (issue 15, item 3): a Hugging Face
hub cache is made of them. Stored as links, recreated as links, counted
once; links that leave the tree are followed; a hostile archive's links
can neither point outside the output folder nor be written through."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import brevis
from brevis.archive.format import HEADER, HEADER_SIZE, VERSION
from brevis.archive.index import Index
from brevis.errors import FormatError, InvalidArgument
from helpers import join, split

BLOB = os.urandom(50_000)


def hub_cache(root: Path) -> Path:
    """A hub cache as huggingface_hub lays it out: snapshots/<rev>/* are
    relative links into blobs/, refs/main names the revision."""
    repo = root / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    (repo / "blobs" / "1111").write_bytes(BLOB)
    (repo / "blobs" / "2222").write_text('{"model_type": "tiny"}')
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    os.symlink("../../blobs/1111", snap / "model.safetensors")
    os.symlink("../../blobs/2222", snap / "config.json")
    os.symlink("abc123", repo / "snapshots" / "latest")  # a link to a folder inside the tree
    return repo


def test_hub_cache_round_trips_with_links_counted_once(tmp_path):
    repo = hub_cache(tmp_path)
    s = brevis.compress([repo], tmp_path / "hub.brv")
    blobs = len(BLOB) + len('{"model_type": "tiny"}') + len("abc123")
    assert s["original_bytes"] == blobs  # not twice: the links add nothing
    assert s["file_count"] == 3 and s["link_count"] == 3
    assert s["archive_bytes"] < 2 * len(BLOB)
    out = tmp_path / "out"
    d = brevis.decompress(tmp_path / "hub.brv", out)
    assert d["original_bytes"] == blobs and d["link_count"] == 3
    snap = out / "snapshots" / "abc123"
    assert os.readlink(snap / "model.safetensors") == "../../blobs/1111"
    assert os.readlink(snap / "config.json") == "../../blobs/2222"
    assert os.readlink(out / "snapshots" / "latest") == "abc123"
    assert (out / "snapshots" / "latest" / "model.safetensors").read_bytes() == BLOB
    assert not (out / "blobs" / "1111").is_symlink()
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file() and not p.is_symlink())
    assert total == blobs
    report = brevis.verify(tmp_path / "hub.brv", [repo])
    assert report["ok"], report["problems"]
    assert report["link_count"] == 3


def test_archives_are_the_newest_format_version_with_or_without_links(tmp_path):
    """Version 8 (as 3 on) holds links as version 2 did: a
    reader of version 1 alone refuses it, dropping nothing."""
    repo = hub_cache(tmp_path)
    brevis.compress([repo], tmp_path / "links.brv")
    brevis.compress([repo / "blobs"], tmp_path / "plain.brv")
    version = lambda p: HEADER.unpack(p.read_bytes()[:HEADER_SIZE])[1]  # noqa: E731
    assert version(tmp_path / "links.brv") == VERSION == 9
    assert version(tmp_path / "plain.brv") == VERSION
    _, index = split((tmp_path / "plain.brv").read_bytes())
    assert "links" not in index  # archives without links keep the version 1 index


def test_dereference_stores_the_content(tmp_path):
    repo = hub_cache(tmp_path)
    (repo / "snapshots" / "latest").unlink()  # a link to a folder is never followed
    s = brevis.compress([repo], tmp_path / "d.brv", dereference=True)
    assert s["link_count"] == 0 and s["file_count"] == 5
    out = tmp_path / "out"
    brevis.decompress(tmp_path / "d.brv", out)
    model = out / "snapshots" / "abc123" / "model.safetensors"
    assert not model.is_symlink() and model.read_bytes() == BLOB


def test_links_leaving_the_tree_are_followed(tmp_path):
    outside = tmp_path / "shared.bin"
    outside.write_bytes(b"shared weights")
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "a.bin").write_bytes(b"a")
    os.symlink(outside, src / "abs.bin")  # absolute, outside
    os.symlink("../shared.bin", src / "rel.bin")  # relative, outside
    s = brevis.compress([src], tmp_path / "x.brv")
    assert s["link_count"] == 0 and s["file_count"] == 3
    out = tmp_path / "out"
    brevis.decompress(tmp_path / "x.brv", out)
    for name in ("abs.bin", "rel.bin"):
        assert not (out / name).is_symlink() and (out / name).read_bytes() == b"shared weights"


def test_a_link_to_an_excluded_file_is_followed(tmp_path):
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "w.bin").write_bytes(b"weights")
    os.symlink("w.bin", src / "alias.bin")
    s = brevis.compress([src], tmp_path / "x.brv", exclude=["w.bin"])
    assert s["link_count"] == 0 and s["file_count"] == 1
    brevis.decompress(tmp_path / "x.brv", tmp_path / "out")
    assert (tmp_path / "out" / "alias.bin").read_bytes() == b"weights"


def test_one_file_and_a_link_is_a_folder(tmp_path):
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "w.bin").write_bytes(b"weights")
    os.symlink("w.bin", src / "alias.bin")
    brevis.compress([src], tmp_path / "x.brv")
    brevis.decompress(tmp_path / "x.brv", tmp_path / "out")
    assert os.readlink(tmp_path / "out" / "alias.bin") == "w.bin"


# ---------------------------------------------------------------- hostile archives
def _index(links, files=("a/w.bin",), dirs=()) -> dict:
    return {"created_by": "test", "dirs": list(dirs),
            "files": [{"path": p, "size": 0, "format": "bytes", "segments": []} for p in files],
            "links": links}


@pytest.mark.parametrize("link", [
    {"path": "a/x", "target": "../../etc/passwd"},  # leaves the tree
    {"path": "x", "target": "/etc/passwd"},  # absolute
    {"path": "a/x", "target": ".."},  # the root
    {"path": "a/x", "target": "./w.bin"},
    {"path": "a/x", "target": "w.bin/"},
    {"path": "a/x", "target": "b//w.bin"},
    {"path": "a/x", "target": "nothing"},  # names nothing archived
    {"path": "a/x", "target": "w.bin\x00"},
    {"path": "a/x", "target": 7},
    {"path": "a/x"},
    {"path": "../x", "target": "a/w.bin"},
])
def test_reader_refuses_unsafe_links(link):
    with pytest.raises(FormatError):
        Index.from_json(_index([link]), HEADER_SIZE, HEADER_SIZE)


def test_reader_refuses_links_through_links():
    # "b" is a link to a folder; "c" goes through it then up: on disk that
    # would resolve from a/ (outside the lexical path): refused, as is any
    # path under a link and any link to a link.
    through = [{"path": "b", "target": "a"}, {"path": "c", "target": "b/../a/w.bin"}]
    with pytest.raises(FormatError):
        Index.from_json(_index(through), HEADER_SIZE, HEADER_SIZE)
    with pytest.raises(FormatError, match="lies under the link"):
        Index.from_json(_index([{"path": "a", "target": "z"}], files=("a/w.bin", "z")), HEADER_SIZE, HEADER_SIZE)
    with pytest.raises(FormatError):
        Index.from_json(_index([{"path": "l1", "target": "a/w.bin"}, {"path": "l2", "target": "l1"}]),
                        HEADER_SIZE, HEADER_SIZE)
    with pytest.raises(FormatError, match="twice"):
        Index.from_json(_index([{"path": "a/w.bin", "target": "w.bin"}]), HEADER_SIZE, HEADER_SIZE)


def test_reader_takes_safe_links():
    ok = [{"path": "x", "target": "a/w.bin"}, {"path": "a/b/y", "target": "../w.bin", "mtime": 5},
          {"path": "f", "target": "a"}, {"path": "a/e", "target": "../d"}]
    index = Index.from_json(_index(ok, dirs=("d",)), HEADER_SIZE, HEADER_SIZE)
    assert [k.target for k in index.links] == ["a/w.bin", "../w.bin", "a", "../d"]
    again = Index.from_json(json.loads(json.dumps(index.to_json())), HEADER_SIZE, HEADER_SIZE)
    assert again == index


def test_decompress_refuses_a_crafted_link_and_writes_nothing(tmp_path):
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "w.bin").write_bytes(b"weights")
    brevis.compress([src], tmp_path / "x.brv")
    head, index = split((tmp_path / "x.brv").read_bytes())
    index["links"] = [{"path": "evil", "target": "../../../../tmp"}]
    (tmp_path / "bad.brv").write_bytes(join(head, index))
    with pytest.raises(FormatError):
        brevis.decompress(tmp_path / "bad.brv", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_merging_never_writes_through_a_link(tmp_path):
    """An existing output whose entry is a link to a file outside: decompress
    -f replaces the link itself (the file outside is untouched), both for a
    file and for an archived link at that place."""
    repo = hub_cache(tmp_path)
    brevis.compress([repo], tmp_path / "hub.brv")
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    out = tmp_path / "out"
    (out / "snapshots" / "abc123").mkdir(parents=True)
    (out / "blobs").mkdir()
    os.symlink(victim, out / "snapshots" / "abc123" / "config.json")
    os.symlink(victim, out / "blobs" / "2222")
    brevis.decompress(tmp_path / "hub.brv", out, force=True)
    assert victim.read_bytes() == b"keep me"
    assert os.readlink(out / "snapshots" / "abc123" / "config.json") == "../../blobs/2222"
    assert not (out / "blobs" / "2222").is_symlink()
    assert (out / "snapshots" / "abc123" / "config.json").read_text() == '{"model_type": "tiny"}'


def test_existing_link_at_a_link_path_needs_force(tmp_path):
    repo = hub_cache(tmp_path)
    brevis.compress([repo], tmp_path / "hub.brv")
    out = tmp_path / "out"
    (out / "snapshots").mkdir(parents=True)
    os.symlink("elsewhere", out / "snapshots" / "latest")
    with pytest.raises(brevis.BrevisError, match="exists"):
        brevis.decompress(tmp_path / "hub.brv", out)


def test_only_brings_what_links_point_at(tmp_path):
    repo = hub_cache(tmp_path)
    brevis.compress([repo], tmp_path / "hub.brv")
    out = tmp_path / "out"
    s = brevis.decompress(tmp_path / "hub.brv", out, only="snapshots/*/config.json")
    assert s["file_count"] == 1 and s["link_count"] == 1
    assert (out / "snapshots" / "abc123" / "config.json").read_text() == '{"model_type": "tiny"}'
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if not p.is_dir()) == [
        "blobs/2222", "snapshots/abc123/config.json"]
    with pytest.raises(InvalidArgument, match="no archived file matches"):
        brevis.decompress(tmp_path / "hub.brv", tmp_path / "none", only=["*.gguf"])


def test_cli_keeps_links_and_reports_them(tmp_path):
    from click.testing import CliRunner

    from brevis.cli import cli

    repo = hub_cache(tmp_path)
    r = CliRunner().invoke(cli, ["compress", str(repo), "-o", str(tmp_path / "hub.brv"), "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    assert s["link_count"] == 3 and s["original_bytes"] == len(BLOB) + 22 + 6
    r = CliRunner().invoke(cli, ["compress", str(repo), "-o", str(tmp_path / "d.brv"), "--dereference",
                                 "--json"])
    assert r.exit_code != 0  # snapshots/latest: a link to a folder, which --dereference cannot store
    (repo / "snapshots" / "latest").unlink()
    r = CliRunner().invoke(cli, ["compress", str(repo), "-o", str(tmp_path / "d.brv"), "--dereference",
                                 "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["link_count"] == 0


def test_reading_through_archived_links(tmp_path):
    import io

    repo = hub_cache(tmp_path)
    brevis.compress([repo], tmp_path / "hub.brv")
    with brevis.open(tmp_path / "hub.brv") as a:
        assert a.read_file("snapshots/abc123/model.safetensors") == BLOB
        assert a.read_file("snapshots/latest/config.json") == b'{"model_type": "tiny"}'  # a folder link on the way
        assert "snapshots/latest" in a.paths()
    out = io.BytesIO()
    s = brevis.cat(tmp_path / "hub.brv", ["snapshots/latest/config.json"], out)
    assert out.getvalue() == b'{"model_type": "tiny"}' and s["files"] == ["blobs/2222"]
