"""The Python API: naming of sources, odd trees and names, determinism across threads."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import brevis
from brevis.archive.reader import ArchiveReader
from brevis.errors import InvalidArgument, OutputExists
from helpers import small_checkpoint, tree, write_safetensors


def names(archive: Path) -> tuple[list[str], list[str]]:
    with ArchiveReader(archive) as reader:
        return [f.path for f in reader.index.files], list(reader.index.dirs)


def roundtrip(sources, tmp_path: Path, **kw) -> Path:
    archive = tmp_path / "a.brv"
    brevis.compress(sources, archive, threads=kw.pop("threads", 1), **kw)
    out = tmp_path / "restored"
    brevis.decompress(archive, out, threads=1)
    return out


# ------------------------------------------------------------ naming
def test_one_folder_is_stored_by_its_contents(tmp_path):
    src = small_checkpoint(tmp_path / "ckpt")
    out = roundtrip([src], tmp_path)
    assert names(tmp_path / "a.brv") == (["config.json", "model.safetensors"], [])
    assert tree(out) == tree(src)


def test_one_file_is_stored_by_its_name(tmp_path):
    src = small_checkpoint(tmp_path / "ckpt")
    out = roundtrip([src / "model.safetensors"], tmp_path)
    assert names(tmp_path / "a.brv") == (["model.safetensors"], [])
    assert os.listdir(out) == ["model.safetensors"]  # a.brv is not named after its file: a folder


def test_an_archive_named_after_its_one_file_gives_the_file_back(tmp_path):
    """zstd-like (issue 15, item 2): X.brv holding only X decompresses to the file X."""
    src = small_checkpoint(tmp_path / "ckpt") / "model.safetensors"
    data = src.read_bytes()
    s = brevis.compress(str(src))  # a str, not its characters; the archive by default: X.brv beside X
    assert s["archive"] == str(src) + ".brv" and s["file_count"] == 1
    src.unlink()
    d = brevis.decompress(str(src) + ".brv")
    assert d["output"] == str(src) and src.read_bytes() == data
    with pytest.raises(OutputExists) as e:
        brevis.decompress(str(src) + ".brv")
    assert "--force" not in str(e.value) and e.value.option == "force"  # CLI words only in the CLI
    brevis.decompress(str(src) + ".brv", force=True)
    brevis.decompress(str(src) + ".brv", tmp_path / "other.bin")  # output names the file
    assert (tmp_path / "other.bin").read_bytes() == data
    (tmp_path / "into").mkdir()
    brevis.decompress(str(src) + ".brv", tmp_path / "into")  # an existing folder: the file goes inside
    assert (tmp_path / "into" / "model.safetensors").read_bytes() == data
    # A folder holding one file stays a folder.
    brevis.compress(tmp_path / "ckpt", tmp_path / "folder.brv", default_excludes=True)
    brevis.decompress(tmp_path / "folder.brv")
    assert (tmp_path / "folder").is_dir()


def test_paths_and_lists_are_both_accepted(tmp_path):
    src = small_checkpoint(tmp_path / "ckpt")
    s = brevis.compress(str(src) + "/")  # one path, not a list of characters; ckpt/ -> ckpt.brv
    assert s["archive"] == str(tmp_path / "ckpt.brv")
    assert brevis.verify(tmp_path / "ckpt.brv", sources=str(src))["source_compared"] is True
    assert brevis.verify(tmp_path / "ckpt.brv")["source_compared"] is False
    brevis.learn_prior(str(src), effort=1)  # was "c: no such file or folder"
    with pytest.raises(InvalidArgument, match="2 sources"):
        brevis.compress([src / "config.json", src / "model.safetensors"])


def test_exclude_and_default_excludes(tmp_path):
    src = small_checkpoint(tmp_path / "ckpt")
    (src / ".git" / "objects").mkdir(parents=True)
    (src / ".git" / "objects" / "big").write_bytes(b"x" * 1000)
    (src / ".DS_Store").write_bytes(b"finder")
    (src / "logs").mkdir()
    (src / "logs" / "a.log").write_text("log")
    (src / "optimizer.bin").write_bytes(b"o" * 10)
    s = brevis.compress(src, tmp_path / "a.brv", exclude=["*.bin", "logs/"])
    assert names(tmp_path / "a.brv")[0] == ["config.json", "model.safetensors"]
    assert sorted((k["kind"], os.path.basename(k["path"])) for k in s["skipped"]) == [
        ("default", ".DS_Store"), ("default", ".git"), ("excluded", "logs"), ("excluded", "optimizer.bin")]
    assert all(k["reason"] for k in s["skipped"])
    s = brevis.compress(src, tmp_path / "b.brv", default_excludes=False, force=True)
    assert ".git/objects/big" in names(tmp_path / "b.brv")[0] and ".DS_Store" in names(tmp_path / "b.brv")[0]
    assert s["skipped"] == []
    # A pattern with '/' matches the whole archived name; a source named explicitly is never excluded.
    s = brevis.compress(src, tmp_path / "c.brv", exclude=["logs/*.log"])
    assert "logs/a.log" not in names(tmp_path / "c.brv")[0] and "optimizer.bin" in names(tmp_path / "c.brv")[0]
    brevis.compress(src / "optimizer.bin", tmp_path / "d.brv", exclude=["*.bin"])
    assert names(tmp_path / "d.brv")[0] == ["optimizer.bin"]


def test_public_names_have_docstrings():
    """dir(brevis) shows the API (issue 15, item 10); every public function says what it does."""
    public = [n for n in brevis.__all__ if n != "__version__"]
    assert set(public) <= set(dir(brevis)) and "open" in dir(brevis)
    for n in public:
        doc = getattr(brevis, n).__doc__ or ""
        assert len(doc.strip()) > 30 and "see api" not in doc, n
    for n in ("compress", "decompress", "extract", "cat"):
        assert "The summary:" in getattr(brevis, n).__doc__, n  # what the returned dict holds


def test_python_errors_speak_no_cli(tmp_path):
    """Exceptions raised to Python callers name no command-line option; the CLI adds its own words."""
    src = small_checkpoint(tmp_path / "ckpt")
    brevis.compress(src, tmp_path / "a.brv")
    for call in (lambda: brevis.compress(src, tmp_path / "a.brv"),
                 lambda: brevis.decompress(tmp_path / "a.brv", src),
                 lambda: brevis.extract(tmp_path / "a.brv", ["layer.weight"], src / "config.json")):
        with pytest.raises(OutputExists) as e:
            call()
        assert "--" not in str(e.value) and e.value.option == "force"
    base = tmp_path / "ckpt"
    brevis.compress(src, tmp_path / "ft.brv", base=base)
    from brevis.errors import BaseRequired
    if brevis.inspect(tmp_path / "ft.brv")["base_required"]:
        with pytest.raises(BaseRequired) as e:
            brevis.verify(tmp_path / "ft.brv")
        assert "--base" not in str(e.value) and e.value.option == "base"


def test_several_sources_keep_their_names(tmp_path):
    a = small_checkpoint(tmp_path / "a", seed=1)
    b = small_checkpoint(tmp_path / "b", seed=2)
    (b / "sub").mkdir()
    (b / "sub" / "x.txt").write_text("x")
    (tmp_path / "loose.bin").write_bytes(b"\x00\x01" * 50)
    out = roundtrip([a / "model.safetensors", b, tmp_path / "loose.bin"], tmp_path)
    assert names(tmp_path / "a.brv")[0] == [
        "model.safetensors", "b/config.json", "b/model.safetensors", "b/sub/x.txt", "loose.bin"]
    files, _ = tree(out)
    assert files[b"b/sub/x.txt"] == tree(b)[0][b"sub/x.txt"]
    assert files[b"model.safetensors"] == tree(a)[0][b"model.safetensors"]


def test_dot_and_trailing_slash(tmp_path):
    src = small_checkpoint(tmp_path / "ckpt")
    archive = tmp_path / "a.brv"
    brevis.compress([str(src) + os.sep], archive)
    assert names(archive)[0] == ["config.json", "model.safetensors"]
    # Among several sources, "." is named after the folder it is.
    (tmp_path / "other.txt").write_text("o")
    cwd = os.getcwd()
    try:
        os.chdir(src)
        brevis.compress([".", "../other.txt"], tmp_path / "b.brv")
    finally:
        os.chdir(cwd)
    assert names(tmp_path / "b.brv")[0] == ["ckpt/config.json", "ckpt/model.safetensors", "other.txt"]


def test_two_sources_with_one_name_are_refused(tmp_path):
    a = small_checkpoint(tmp_path / "a")
    b = small_checkpoint(tmp_path / "b")
    with pytest.raises(InvalidArgument, match="config.json"):
        brevis.compress([a / "config.json", b / "config.json"], tmp_path / "x.brv")
    assert not (tmp_path / "x.brv").exists()


def test_output_inside_source_is_refused(tmp_path):
    src = small_checkpoint(tmp_path / "ckpt")
    (src / "old.brv").write_bytes(b"x")
    with pytest.raises(InvalidArgument):
        brevis.compress([src], src / "old.brv", force=True)
    assert (src / "old.brv").read_bytes() == b"x"


def test_missing_source_and_existing_output(tmp_path):
    with pytest.raises(InvalidArgument):
        brevis.compress([tmp_path / "nope"], tmp_path / "x.brv")
    with pytest.raises(InvalidArgument):
        brevis.compress([], tmp_path / "x.brv")
    (tmp_path / "f").write_text("f")
    (tmp_path / "x.brv").write_text("keep")
    with pytest.raises(OutputExists):
        brevis.compress([tmp_path / "f"], tmp_path / "x.brv")
    assert (tmp_path / "x.brv").read_text() == "keep"


# ------------------------------------------------------------ odd trees
def test_empty_folders_and_files(tmp_path):
    src = tmp_path / "src"
    (src / "empty").mkdir(parents=True)
    (src / "nested" / "deeper" / "deepest").mkdir(parents=True)
    (src / "holds_empty_file").mkdir()
    (src / "holds_empty_file" / "zero.bin").write_bytes(b"")
    (src / "zero.safetensors").write_bytes(b"")
    (src / "one.bin").write_bytes(b"\x00")
    out = roundtrip([src], tmp_path)
    assert tree(out) == tree(src)
    assert tree(out)[1] == {b"empty", b"nested/deeper/deepest"}
    assert (out / "zero.safetensors").stat().st_size == 0


def test_empty_folder_alone_and_among_sources(tmp_path):
    empty = tmp_path / "nothing"
    empty.mkdir()
    out = roundtrip([empty], tmp_path)
    assert out.is_dir() and os.listdir(out) == []
    (tmp_path / "f.txt").write_text("f")
    archive = tmp_path / "b.brv"
    brevis.compress([empty, tmp_path / "f.txt"], archive)
    assert names(archive) == (["f.txt"], ["nothing"])
    brevis.decompress(archive, tmp_path / "b")
    assert (tmp_path / "b" / "nothing").is_dir()


def test_only_empty_files(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a").write_bytes(b"")
    (tmp_path / "src" / "b").write_bytes(b"")
    out = roundtrip([tmp_path / "src"], tmp_path)
    assert tree(out) == tree(tmp_path / "src")
    info = brevis.inspect(tmp_path / "a.brv")
    assert info["original_bytes"] == 0


def test_non_utf8_names(tmp_path):
    src = os.path.join(os.fsencode(tmp_path), b"src")
    os.makedirs(os.path.join(src, b"dir\xff\xfe"))
    names_ = [b"caf\xe9.bin", b"dir\xff\xfe/inner\x80.txt", b"ok-\xc3\xa9.json", b"\xed\xa0\x80.bin"]
    for i, n in enumerate(names_):
        with open(os.path.join(src, n), "wb") as f:
            f.write(bytes([i]) * (10 + i))
    os.makedirs(os.path.join(src, b"empty\xa0"))
    archive = tmp_path / "a.brv"
    brevis.compress([os.fsdecode(src)], archive)
    out = tmp_path / "restored"
    brevis.decompress(archive, out)
    assert tree(out) == tree(src)
    assert brevis.verify(archive, [os.fsdecode(src)])["ok"]
    stored = names(archive)
    assert "caf\udce9.bin" in stored[0] and "empty\udca0" in stored[1]


def test_links_to_files_are_followed(tmp_path):
    real = small_checkpoint(tmp_path / "real")
    src = tmp_path / "src"
    src.mkdir()
    os.symlink(real / "model.safetensors", src / "model.safetensors")  # like a Hugging Face cache
    os.symlink(os.path.relpath(real / "config.json", src), src / "config.json")
    out = roundtrip([src], tmp_path)
    assert tree(out) == tree(real)
    assert not (out / "model.safetensors").is_symlink()
    # A link given as the source itself is followed too.
    archive = tmp_path / "link.brv"
    brevis.compress([src / "config.json"], archive)
    assert names(archive)[0] == ["config.json"]


def test_links_to_folders_outside_are_skipped_and_broken_links_refused(tmp_path):
    real = small_checkpoint(tmp_path / "real")
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.bin").write_bytes(b"w")
    os.symlink(real, src / "linked")
    # One link to a folder outside the tree does not abort the run (issue 15, item 9): skipped, reported.
    s = brevis.compress(src, tmp_path / "a.brv")
    assert [(k["path"], k["kind"]) for k in s["skipped"]] == [(str(src / "linked"), "link")]
    assert names(tmp_path / "a.brv")[0] == ["w.bin"]
    (tmp_path / "a.brv").unlink()
    os.unlink(src / "linked")
    os.symlink(tmp_path / "missing", src / "broken")
    with pytest.raises(InvalidArgument):
        brevis.compress([src], tmp_path / "a.brv")
    assert not (tmp_path / "a.brv").exists()


# ------------------------------------------------------------ determinism
@pytest.fixture(scope="module")
def bigger(tmp_path_factory) -> Path:
    """Several files, tensors of several dtypes, many chunks each."""
    root = tmp_path_factory.mktemp("threads") / "src"
    small_checkpoint(root, elements=8192)
    rng = np.random.default_rng(5)
    write_safetensors(root / "more.safetensors", {
        "a": ("F16", (4096,), (rng.standard_normal(4096) * 0.1).astype(np.float16).tobytes()),
        "b": ("I32", (2048,), rng.integers(-50, 50, 2048).astype(np.int32).tobytes()),
        "c": ("F32", (64, 64), np.tile(rng.standard_normal(64).astype(np.float32), 64).tobytes()),
    })
    (root / "sub").mkdir()
    (root / "sub" / "blob.bin").write_bytes(rng.integers(0, 4, 30000).astype(np.uint8).tobytes())
    return root


def test_threads_give_identical_archives(bigger, tmp_path):
    archives = []
    for threads in (1, 2, 3):
        out = tmp_path / f"t{threads}.brv"
        brevis.compress([bigger], out, threads=threads, chunk_bytes=4096)
        archives.append(out.read_bytes())
    assert archives[0] == archives[1] == archives[2]
    with ArchiveReader(tmp_path / "t1.brv") as reader:
        assert max(len(s.chunks) for f in reader.index.files for s in f.segments) > 4


def test_threads_give_identical_archives_default_chunks(bigger, tmp_path):
    brevis.compress([bigger], tmp_path / "a.brv", threads=1)
    brevis.compress([bigger], tmp_path / "b.brv", threads=2)
    assert (tmp_path / "a.brv").read_bytes() == (tmp_path / "b.brv").read_bytes()


def test_decompress_and_verify_with_threads(bigger, tmp_path):
    archive = tmp_path / "a.brv"
    brevis.compress([bigger], archive, threads=2, chunk_bytes=4096)
    for threads in (1, 2, 4):
        out = tmp_path / f"out{threads}"
        brevis.decompress(archive, out, threads=threads)
        assert tree(out) == tree(bigger)
        report = brevis.verify(archive, [bigger], threads=threads)
        assert report["ok"], report["problems"]


def test_unpack_gives_every_file_in_memory_from_a_path_or_bytes(bigger, tmp_path):
    """brevis.unpack: the files' bytes, checked, from the archive's path or its
    bytes in memory (any buffer, read in place), on any number of threads."""
    import mmap

    archive = tmp_path / "a.brv"
    brevis.compress([bigger], archive, threads=1, chunk_bytes=4096)
    want = {p: (bigger / p).read_bytes() for p in ("config.json", "model.safetensors", "more.safetensors",
                                                  "sub/blob.bin")}
    data = archive.read_bytes()
    with open(archive, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        for source, threads in ((archive, 1), (str(archive), 2), (data, 1), (bytearray(data), 3),
                                (memoryview(data), 2), (mapped, 2)):
            got = brevis.unpack(source, threads=threads)
            assert {p: bytes(v) for p, v in got.items()} == want
            del got


def test_unpack_refuses_damaged_or_truncated_bytes(bigger, tmp_path):
    from brevis.errors import ChecksumError, FormatError, TruncatedError

    archive = tmp_path / "a.brv"
    brevis.compress([bigger], archive, threads=1)
    data = archive.read_bytes()
    with pytest.raises(TruncatedError):
        brevis.unpack(data[:-3])
    with pytest.raises(FormatError):
        brevis.unpack(b"")
    with ArchiveReader(archive) as reader:
        offset = reader.index.files[1].segments[0].chunks[0].streams[0][0]
    damaged = bytearray(data)
    damaged[offset] ^= 0x10
    with pytest.raises(ChecksumError):
        brevis.unpack(damaged)
    with pytest.raises(InvalidArgument):
        brevis.unpack(np.zeros((4, 4), np.uint32)[:, 1])  # not contiguous


def test_summary_and_inspect(bigger, tmp_path):
    archive = tmp_path / "a.brv"
    s = brevis.compress([bigger], archive, threads=1)
    assert s["file_count"] == 4
    assert s["archive_bytes"] == archive.stat().st_size
    assert s["original_bytes"] == sum(p.stat().st_size for p in bigger.rglob("*") if p.is_file())
    info = brevis.inspect(archive)
    assert info["original_bytes"] == s["original_bytes"]
    assert sum(f["original_bytes"] for f in info["files"]) == s["original_bytes"]
    for f in info["files"]:
        assert sum(seg["original_bytes"] for seg in f["segments"]) == f["original_bytes"]


def test_verify_reports_missing_and_extra_source_files(bigger, tmp_path):
    archive = tmp_path / "a.brv"
    brevis.compress([bigger], archive, threads=1)
    src = tmp_path / "src"
    shutil.copytree(bigger, src)
    (src / "config.json").unlink()
    (src / "extra.txt").write_text("new")
    report = brevis.verify(archive, [src])
    assert not report["ok"]
    assert {p["file"] for p in report["problems"]} == {"config.json", "extra.txt"}


def test_unpack_puts_small_files_in_one_buffer(tmp_path, monkeypatch):
    """Files under HUGE_PAGE_ARRAY share one buffer (numpy advises it for
    huge pages) where they add up to HUGE_PAGE_ARRAY to SHARED_MOST, each
    in a view of its own that no other overlaps; a larger file has its own
    buffer; every byte comes back."""
    from brevis.codec import decoder

    monkeypatch.setattr(decoder, "HUGE_PAGE_ARRAY", 100_000)
    monkeypatch.setattr(decoder, "SHARED_MOST", 1_000_000)
    views = decoder._output_buffers([60_000, 0, 150_000, 50_000, 99_999])
    assert [len(v) for v in views] == [60_000, 0, 150_000, 50_000, 99_999]
    small = [views[k] for k in (0, 1, 3, 4)]
    assert all(v.base is small[0].base and v.base is not None for v in small)
    assert views[2].base is None  # an array of its own
    starts = [v.ctypes.data - small[0].base.ctypes.data for v in (views[0], views[3], views[4])]
    assert starts == [0, 60_000, 110_000]  # consecutive, none overlapping (the empty one takes no bytes)
    assert all(v.base is None for v in decoder._output_buffers([60_000, 30_000]))  # under the threshold together
    assert all(v.base is None for v in decoder._output_buffers([99_999] * 11))  # past SHARED_MOST

    rng = np.random.default_rng(3)
    src = tmp_path / "s"
    src.mkdir()
    sizes = {"a.bin": 70_000, "b.npy": 40_000, "c.bin": 120_000, "empty": 0}
    for name, n in sizes.items():
        (src / name).write_bytes(rng.integers(0, 7, n, dtype=np.uint8).tobytes())
    archive = tmp_path / "s.brv"
    brevis.compress(src, archive)
    got = brevis.unpack(archive.read_bytes(), threads=2)
    assert {name: bytes(v) for name, v in got.items()} == {name: (src / name).read_bytes() for name in sizes}


def test_unpack_makes_its_output_while_the_index_is_checked(tmp_path, monkeypatch):
    """Where the output is large enough (here: any size), unpack
    makes its buffers from the index as parsed and faults them in on a
    thread while the index is checked; the bytes are the same, and where
    the checks fail the thread is stopped and nothing is returned."""
    import threading

    from brevis.archive import index as index_module
    from brevis.codec import decoder
    from brevis.errors import FormatError
    from brevis.workers import heap

    monkeypatch.setattr(decoder, "EARLY_BYTES", 0)
    started = []
    real = heap.populate
    monkeypatch.setattr(decoder, "populate", lambda bufs: started.append(len(bufs)) or real(bufs))
    rng = np.random.default_rng(2)
    src = tmp_path / "m"
    src.mkdir()
    (src / "a.bin").write_bytes(rng.integers(0, 255, 300_000, dtype=np.uint8).tobytes())
    (src / "b.npy").write_bytes(rng.standard_normal(50_000).astype(np.float32).tobytes())
    archive = tmp_path / "m.brv"
    brevis.compress(src, archive)
    data = archive.read_bytes()
    reader_module = __import__("brevis.archive.reader", fromlist=["_last_index"])
    monkeypatch.setattr(reader_module, "_last_index", None)  # the index read afresh
    got = brevis.unpack(data, threads=2)
    assert started == [2]
    assert bytes(got["a.bin"]) == (src / "a.bin").read_bytes() and bytes(got["b.npy"]) == (src / "b.npy").read_bytes()

    def refuse(*a, **k):
        raise FormatError("refused")

    monkeypatch.setattr(reader_module, "_last_index", None)
    monkeypatch.setattr(index_module.Index, "from_json", staticmethod(refuse))
    with pytest.raises(FormatError, match="refused"):
        brevis.unpack(data, threads=2)
    assert started == [2, 2]
    assert not [t for t in threading.enumerate() if t.name == "brevis-populate"]
