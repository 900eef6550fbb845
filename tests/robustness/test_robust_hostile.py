"""Issue 16: hostile archives and racing writers, each finding kept as a regression case.

Archives are crafted with every checksum recomputed (robust_util.join),
so only the reader's own limits stand between them and the decoders.
Memory and time bounds are in test_robust_memory.py.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zstandard

import brevis
from brevis import dtypes
from brevis.archive import format as fmt
from brevis.archive.index import Chunk, FileEntry, Index, SegmentEntry
from brevis.archive.reader import ArchiveReader
from brevis.archive.writer import ArchiveWriter
from brevis.dsl.program import Program
from brevis.errors import BrevisError, FormatError, InvalidArgument, IOFailure, OutputExists
from brevis.fs import atomic
from brevis.fs.staging import remove_tree
from brevis.synth.prior import Prior
from robust_util import ENV, REPO, join, on_first_stream, run_measured, split, tree, write_safetensors

BREVIS = [sys.executable, "-m", "brevis"]
STRICT = {**ENV, "PYTHONIOENCODING": "utf-8:strict"}


def cli(*args, env=ENV, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([*BREVIS, *map(str, args)], capture_output=True, text=True, env=env, timeout=timeout,
                          errors="backslashreplace")


def one_line_error(r: subprocess.CompletedProcess, code: int) -> None:
    assert r.returncode == code, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.fixture
def seed(tmp_path) -> tuple[bytes, dict]:
    """A small valid archive of two files (a.bin, b.bin), taken apart."""
    src = tmp_path / "seed"
    src.mkdir()
    (src / "a.bin").write_bytes(b"alpha" * 100)
    (src / "b.bin").write_bytes(b"beta" * 100)
    brevis.compress([src], tmp_path / "seed.brv")
    return split((tmp_path / "seed.brv").read_bytes())


def craft(tmp_path: Path, seed, edit, name="crafted.brv") -> Path:
    head, index = seed
    index = json.loads(json.dumps(index))
    edit(index)
    path = tmp_path / name
    path.write_bytes(join(head, index))
    return path


# ------------------------------------------------------------ 1. the writer checks what the reader checks
def tensor_file(path: Path, shape) -> None:
    write_safetensors(path, {"w": ("U8", tuple(shape), b"" if 0 in shape else bytes(int(np.prod(shape))))})


@pytest.mark.parametrize("shape", [(1,) * 65, (0, 2**70), (0, 2**62, 2**62)], ids=["65-dims", "0x2^70", "0x2^62x2^62"])
def test_a_tensor_the_reader_would_refuse_is_stored_as_bytes(tmp_path, shape):
    """Finding 1 (and [0, 2**70]): compress wrote what decompress refused."""
    src = tmp_path / "src"
    src.mkdir()
    tensor_file(src / "m.safetensors", shape)
    (src / "other.safetensors").write_bytes((src / "m.safetensors").read_bytes())
    write_safetensors(src / "fine.safetensors", {"v": ("F32", (4,), bytes(16))})
    archive = tmp_path / "a.brv"
    brevis.compress([src], archive)
    formats = {f["path"]: f["format"] for f in brevis.inspect(archive)["files"]}
    assert formats == {"m.safetensors": "bytes", "other.safetensors": "bytes", "fine.safetensors": "safetensors"}
    assert brevis.verify(archive, sources=[src])["ok"]
    brevis.decompress(archive, tmp_path / "out")
    assert tree(tmp_path / "out") == tree(src)
    with brevis.open(archive) as a:
        assert list(a) == ["v"]


@pytest.mark.parametrize("shape", [[1] * 65, [0, 2**70], [0, 2**62, 2**62]], ids=["65-dims", "0x2^70", "0x2^62x2^62"])
def test_the_reader_refuses_such_a_shape_in_one_line(tmp_path, seed, shape):
    def edit(index):
        seg = index["files"][0]["segments"][0]
        seg.update(dtype="U8", shape=shape, length=0, chunks=[])
        index["files"][0]["size"] = sum(s["length"] for s in index["files"][0]["segments"])

    path = craft(tmp_path, seed, edit)
    with pytest.raises(FormatError, match="malformed shape|too large"):
        brevis.open(path)
    for command in ("ls", "inspect", "verify"):
        one_line_error(cli(command, path), 3)


def bad_indexes():
    """(what, index edit) for every kind of limit the reader enforces on an index."""
    def seg0(index):
        return index.files[0].segments[0]

    def dims(index):
        s = seg0(index)
        s.dtype, s.shape = dtypes.lookup("U8"), (1,) * 65
    def huge_dim(index):
        s = seg0(index)
        s.dtype, s.shape, s.length, s.chunks = dtypes.lookup("U8"), (0, 2**70), 0, []
        index.files[0].size = 0
    def disagree(index):
        seg0(index).length += 1
    def big_chunk(index):
        c = seg0(index).chunks[0]
        seg0(index).chunks[0] = Chunk(c.program, fmt.MAX_CHUNK_BYTES + 1, c.streams, c.digest)
    def surrogate(index):
        index.files[0].path = "a\ud800"
    def two_spellings(index):
        index.files[0].path, index.files[1].path = "a\u00e9", "a\udcc3\udca9"
    def twice(index):
        index.files[1].path = index.files[0].path
    def entries(index):
        c = seg0(index).chunks[0]
        seg0(index).chunks += [c] * fmt.FREE_ENTRIES

    def decode_memory(index):  # a program nesting sparse 14 deep, on a 64 MiB chunk (dsl/memory.py)
        def nest(d):
            return ["raw", {}] if d == 0 else ["sparse", {"value": 0}, [["raw", {}], ["raw", {}], nest(d - 1)]]
        s, c = seg0(index), seg0(index).chunks[0]
        s.programs = [Program.from_json(nest(14))]
        s.chunks = [Chunk(0, fmt.MAX_CHUNK_BYTES, c.streams * 29, c.digest)]
        s.length = index.files[0].size = fmt.MAX_CHUNK_BYTES
    return [("65 dims", dims), ("2^70", huge_dim), ("length", disagree), ("chunk", big_chunk),
            ("surrogate", surrogate), ("spellings", two_spellings), ("twice", twice), ("entries", entries),
            ("decode memory", decode_memory)]


def two_file_index(writer: ArchiveWriter) -> Index:
    program = Program.from_json(["raw", {}])
    files = []
    for name, data in (("a", b"aaaa"), ("b", b"bbbb")):
        where = writer.write_stream(data, fmt.stream_check(data))
        seg = SegmentEntry("", None, None, len(data), [program],
                           [Chunk(0, len(data), [where], fmt.chunk_digest(data))])
        files.append(FileEntry(name, len(data), "bytes", [seg]))
    return Index(files, [], "test")


@pytest.mark.parametrize("what,edit", bad_indexes(), ids=[w for w, _ in bad_indexes()])
def test_every_reader_limit_is_checked_by_the_writer_first(tmp_path, what, edit):
    """The writer reads its own index back through the reader's checks (the
    same compiled parser, the footer's and the entries' limits) before
    publishing: what it writes, readers read; what they refuse, it never
    writes. Each case is a limit of the reader, met by the writer first."""
    good = tmp_path / "good.brv"
    with ArchiveWriter(good) as w:
        w.finish(two_file_index(w))
    ArchiveReader(good).close()
    out = tmp_path / "bad.brv"
    with pytest.raises(BrevisError, match="readers would refuse it"):
        with ArchiveWriter(out) as w:
            index = two_file_index(w)
            edit(index)
            w.finish(index)
    assert sorted(os.listdir(tmp_path)) == ["good.brv"]
    # ... and the reader does refuse that index, crafted by hand.
    head, obj = split(good.read_bytes())
    with ArchiveWriter(tmp_path / "unchecked.brv") as w:
        index = two_file_index(w)
        edit(index)
        obj = index.to_json()
    bad = tmp_path / "crafted.brv"
    bad.write_bytes(join(head, obj))
    with pytest.raises(FormatError):
        ArchiveReader(bad)


def test_the_writer_uses_the_readers_own_parser(tmp_path, monkeypatch):
    """Every check the schema compiles into the reader runs in the writer:
    the writer calls Index.from_json itself, not a copy of it."""
    from brevis.archive import index as index_module

    calls = []
    real = index_module.Index.from_json

    def spy(obj, start, end):
        calls.append((start, end))
        return real(obj, start, end)

    monkeypatch.setattr(index_module.Index, "from_json", staticmethod(spy))
    with ArchiveWriter(tmp_path / "a.brv") as w:
        w.finish(two_file_index(w))
    with ArchiveReader(tmp_path / "a.brv") as reader:
        assert calls[:1] == [(fmt.HEADER_SIZE, reader.footer.index_offset)]


# ------------------------------------------------------------ 2. a source replaced while compressing
@pytest.fixture
def racing(tmp_path, monkeypatch):
    """A source folder, and a hook running `change` when the first stream is written."""
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(3)
    (src / "a.bin").write_bytes(rng.integers(0, 4, 64 * 1024, dtype=np.uint8).tobytes())
    return src, on_first_stream(monkeypatch)


def replace_keeping_size_and_mtime(target: Path) -> None:
    """`cp other target.new; touch -r target target.new; mv target.new target`."""
    st = target.stat()
    new = target.with_name(target.name + ".new")
    new.write_bytes(bytes(st.st_size))
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(new, target)


def rewrite_keeping_mtime(target: Path) -> None:
    """The same inode written over, its mtime put back."""
    st = target.stat()
    with open(target, "r+b") as f:
        f.write(bytes(st.st_size))
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("change", [replace_keeping_size_and_mtime, rewrite_keeping_mtime], ids=["replaced", "rewritten"])
@pytest.mark.parametrize("how", ["inline", "processes"])
def test_a_source_changed_with_its_size_and_mtime_kept(racing, tmp_path, change, how):
    """Finding 2: exit 0 and a file part old, part new. Every read (here and
    in the worker processes) checks the file's inode, size, mtime and
    ctime against the scan's, and so does the end check."""
    src, state = racing
    target = src / "a.bin"
    state["change"] = lambda: change(target)
    kw = dict(threads=2, processes=True) if how == "processes" else dict(threads=1)
    with pytest.raises(IOFailure, match="changed while being read"):
        brevis.compress([src], tmp_path / "a.brv", chunk_bytes=4096, **kw)
    assert sorted(os.listdir(tmp_path)) == ["src"]


# ------------------------------------------------------------ 3. two names, one file
def test_two_spellings_of_one_name_are_refused(tmp_path, seed):
    """Finding 3: "a\\u00e9" and its surrogate escape "a\\udcc3\\udca9" are the
    same bytes on disk: exit 0, "3 files", one file's bytes gone."""
    def edit(index):
        index["files"][0]["path"], index["files"][1]["path"] = "a\u00e9", "a\udcc3\udca9"

    path = craft(tmp_path, seed, edit)
    for command in ("decompress", "verify", "ls", "inspect"):
        one_line_error(cli(command, path, env=STRICT), 3)
    assert sorted(os.listdir(tmp_path)) == ["crafted.brv", "seed", "seed.brv"]


@pytest.mark.parametrize("name", ["a\ud800", "\udc41", "x/\udcff\ud800y"])
def test_lone_surrogates_in_a_path(tmp_path, seed, name):
    def edit(index):
        index["files"][0]["path"] = name

    path = craft(tmp_path, seed, edit)
    for command in ("decompress", "verify", "ls", "inspect"):
        one_line_error(cli(command, path, env=STRICT), 3)


def test_names_that_are_one_file_on_a_case_insensitive_file_system(tmp_path, seed, monkeypatch):
    """On a case-insensitive (or normalizing) file system, "A" and "a" are one
    file: staging creates every file exclusively, so the second name fails
    the run instead of taking the first one's bytes. Simulated here by a
    file system that folds case."""
    from brevis.codec import decoder

    def edit(index):
        index["files"][0]["path"], index["files"][1]["path"] = "Model.bin", "model.bin"

    path = craft(tmp_path, seed, edit)
    real_open = open

    def folding_open(file, mode="r", *args, **kw):
        p = Path(file)
        return real_open(p.with_name(p.name.lower()), mode, *args, **kw)

    monkeypatch.setattr(decoder, "open", folding_open, raising=False)
    with pytest.raises(FormatError, match="are one file on this file system"):
        brevis.decompress(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_non_utf8_names_decompress_to_their_bytes(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / os.fsdecode(b"caf\xe9.bin")).write_bytes(b"latin-1 name")
    (src / "café.bin").write_bytes(b"utf-8 name")
    brevis.compress([src], tmp_path / "a.brv")
    brevis.decompress(tmp_path / "a.brv", tmp_path / "out")
    assert tree(tmp_path / "out") == tree(src)
    for command in ("ls", "inspect"):
        r = cli(command, tmp_path / "a.brv", env=STRICT)
        assert r.returncode == 0, r.stderr
        assert "caf\\xe9.bin" in r.stdout and "café.bin" in r.stdout


# ------------------------------------------------------------ 4. two writers, one new output
def test_compress_never_replaces_an_output_made_meanwhile(racing, tmp_path):
    """Finding 4: two compress runs to one new output, without -f, both exit
    0 and the second replaces the first. Now the archive is linked into
    place, which fails where a file appeared since the start."""
    src, state = racing
    out = tmp_path / "a.brv"
    state["change"] = lambda: out.write_bytes(b"the other run's archive")
    with pytest.raises(OutputExists):
        brevis.compress([src], out, chunk_bytes=4096)
    assert out.read_bytes() == b"the other run's archive"
    assert sorted(os.listdir(tmp_path)) == ["a.brv", "src"]
    state["change"] = lambda: out.write_bytes(b"again")
    brevis.compress([src], out, chunk_bytes=4096, force=True)  # -f replaces, as asked
    assert out.read_bytes() != b"again"


def test_extract_never_replaces_an_output_made_meanwhile(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    write_safetensors(src / "m.safetensors", {"w": ("F32", (8,), bytes(32))})
    brevis.compress([src], tmp_path / "a.brv")
    out = tmp_path / "w.safetensors"
    import brevis.access as access

    real = access.make_temp

    def racing_make_temp(parent, name, *a, **kw):
        made = real(parent, name, *a, **kw)
        out.write_bytes(b"the other run's file")
        return made

    monkeypatch.setattr(access, "make_temp", racing_make_temp)
    with pytest.raises(OutputExists):
        brevis.extract(tmp_path / "a.brv", ["w"], out)
    assert out.read_bytes() == b"the other run's file"
    assert sorted(os.listdir(tmp_path)) == ["a.brv", "src", "w.safetensors"]


def test_a_staging_folder_removed_before_it_is_locked_is_made_again(tmp_path, monkeypatch):
    """Another run's remove_stale may take a staging folder between its
    mkdtemp and its lock (it looks older than that run's start): decompress
    makes another instead of failing with 'No such file or directory'
    (seen in test_concurrent_readers, 1 run in 30-60)."""
    src = tmp_path / "w.safetensors"
    write_safetensors(src, {"w": ("F32", (64,), np.arange(64, dtype=np.float32).tobytes())})
    brevis.compress([src], tmp_path / "w.brv", threads=1)
    real = atomic.tempfile.mkdtemp
    taken = []

    def cleaned_at_once(*a, **kw):
        path = real(*a, **kw)
        if not taken:
            taken.append(path)
            os.rmdir(path)  # what the other run's remove_stale does
        return path

    monkeypatch.setattr(atomic.tempfile, "mkdtemp", cleaned_at_once)
    brevis.decompress(tmp_path / "w.brv", tmp_path / "out", threads=1)
    assert taken and (tmp_path / "out" / "w.safetensors").read_bytes() == src.read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["out", "w.brv", "w.safetensors"]


def test_move_new_without_hard_links(tmp_path, monkeypatch):
    """Where link() is not supported, renameat2(RENAME_NOREPLACE) does the same;
    where neither is, a clear error (never a silent replace)."""
    def no_link(*a, **kw):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(atomic.os, "link", no_link)
    (tmp_path / "src").write_bytes(b"new")
    (tmp_path / "taken").write_bytes(b"old")
    with pytest.raises(OutputExists):
        atomic.move_new(tmp_path / "src", tmp_path / "taken")
    assert (tmp_path / "taken").read_bytes() == b"old"
    atomic.move_new(tmp_path / "src", tmp_path / "free")
    assert (tmp_path / "free").read_bytes() == b"new" and not (tmp_path / "src").exists()


def test_two_real_compress_runs_to_one_output(tmp_path):
    """The race itself, by the CLI: of two runs to one new output, at most one
    succeeds; the other fails with 'exists' (exit 7), whoever is first."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(np.random.default_rng(0).integers(0, 8, 1 << 20, dtype=np.uint8).tobytes())
    out = tmp_path / "a.brv"
    runs = [subprocess.Popen([*BREVIS, "compress", str(src), "-o", str(out), "-q", "-j", "1"], env=ENV,
                             stderr=subprocess.PIPE, text=True) for _ in range(2)]
    codes = sorted(p.wait(timeout=120) for p in runs)
    assert codes == [0, 7], codes
    assert brevis.verify(out, sources=[src])["ok"]


# ------------------------------------------------------------ 5. extract's output is its own archive
def test_extract_refuses_to_write_over_its_archive(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    write_safetensors(src / "m.safetensors", {"w": ("F32", (8,), bytes(32))})
    archive = tmp_path / "a.brv"
    brevis.compress([src], archive)
    before = archive.read_bytes()
    one_line_error(cli("extract", archive, "w", "-o", archive, "-f"), 2)
    os.symlink(archive, tmp_path / "link.safetensors")
    one_line_error(cli("extract", archive, "w", "-o", tmp_path / "link.safetensors", "-f"), 2)
    assert archive.read_bytes() == before


# ------------------------------------------------------------ crashes that must be one-line errors
def test_a_path_of_1500_components(tmp_path, seed):
    """RecursionError (Path.mkdir recurses once per component) for a path under PATH_MAX."""
    deep = "/".join(["d"] * 1500) + "/f"

    def edit(index):
        index["files"][0]["path"] = deep

    path = craft(tmp_path, seed, edit)
    r = cli("decompress", path, "-o", tmp_path / "out")
    try:
        if r.returncode == 0:
            assert (tmp_path / "out" / deep).read_bytes() == b"alpha" * 100
        else:
            one_line_error(r, 8)  # a file system whose paths cannot be that long: an I/O error, not a crash
        assert "Recursion" not in r.stderr
    finally:
        remove_tree(tmp_path / "out")  # pytest's own cleanup (shutil.rmtree) would recurse 1,500 deep


@pytest.mark.parametrize("value", ['"many"', "1e400", "-1", "true", "1.5"])
def test_a_prior_with_a_bad_sample_count(tmp_path, value):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"x" * 100)
    prior = tmp_path / "prior.json"
    prior.write_text('{"format": "brevis-prior", "version": 1, "samples": %s, "counts": {}}' % value)
    one_line_error(cli("compress", src, "-o", tmp_path / "a.brv", "--prior", prior), 2)
    assert not (tmp_path / "a.brv").exists()


@pytest.mark.parametrize("prior", [{"samples": "many"}, {"samples": float("inf")},
                                   {"counts": {"x": {"raw": float("inf")}}},
                                   {"programs": [{"kind": "f32", "role": "w", "relative": 1e400,
                                                  "program": ["raw", {}]}]}])
def test_an_archive_carrying_a_bad_prior(tmp_path, seed, prior):
    """compress-many reads the prior of an archive already in its output folder:
    a bad one is not used (and does not crash the run)."""
    from brevis import fleet

    def edit(index):
        index["prior"] = {"format": "brevis-prior", "version": 1, "samples": 3, "counts": {}, **prior}

    path = craft(tmp_path, seed, edit)
    assert fleet.archive_prior(path) is None
    with pytest.raises(InvalidArgument):
        with ArchiveReader(path) as reader:
            Prior.from_json(reader.index.prior)


def _wait_until_mapped(p: subprocess.Popen, library: str, timeout: float = 30.0) -> bool:
    """Poll /proc until the process maps `library`; False where /proc cannot
    tell (not Linux) or the process ended first."""
    maps = Path(f"/proc/{p.pid}/maps")
    end = time.monotonic() + timeout
    while time.monotonic() < end and p.poll() is None:
        try:
            if library in maps.read_text():
                return True
        except OSError:
            return False
        time.sleep(0.0005)
    return False


def test_ctrl_c_while_the_brevis_command_imports(tmp_path):
    """The `brevis` script imports brevis.cli (numpy, zstandard...) before
    main() runs: Ctrl-C then printed a traceback and died by SIGINT."""
    script = Path(sys.executable).with_name("brevis")
    if not script.exists():
        pytest.skip("no brevis script next to this Python")
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"x")
    # First the moment numpy's core is mapped (Brevis imports it after the
    # guard is set; a fixed delay can land in Python's own start on a loaded
    # machine, before any Brevis code runs), then later moments.
    for delay in ("numpy", 0.2, 0.35):
        p = subprocess.Popen([str(script), "compress", str(src), "-o", str(tmp_path / "a.brv")], env=ENV,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if delay == "numpy":
            if not _wait_until_mapped(p, "_multiarray_umath"):
                p.kill()
                out, err = p.communicate()
                assert not sys.platform.startswith("linux"), ("numpy never mapped", p.returncode, err)
                continue
        else:
            time.sleep(delay)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        if p.returncode == 0 or (p.returncode == -signal.SIGINT and out and not err
                                 and (tmp_path / "a.brv").exists()):
            # Finished before the signal, or finished and the signal came while
            # the interpreter was exiting (its handlers are gone then): the
            # archive and the summary are out, nothing was left half done.
            (tmp_path / "a.brv").unlink(missing_ok=True)
            continue
        assert p.returncode == 130 and "Traceback" not in err, (delay, p.returncode, err)
        (tmp_path / "a.brv").unlink(missing_ok=True)
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".partial")]


def test_a_full_shm_falls_back_to_pipes(tmp_path, monkeypatch):
    """/dev/shm of 64 MiB (Docker's default) and -j 16: ENOSPC in a worker
    crashed the run. Now a batch that cannot be written there comes back
    through the result pipe: the same archive."""
    from brevis.workers import shared

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(np.random.default_rng(1).integers(0, 16, 1 << 20, dtype=np.uint8).tobytes())
    brevis.compress([src], tmp_path / "one.brv", threads=1, chunk_bytes=1 << 16)

    class FullShm:  # the os module as shared.py sees it, on a full /dev/shm
        def __getattr__(self, name):
            return getattr(os, name)

        @staticmethod
        def write(fd, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shared, "os", FullShm())  # forked workers inherit it
    brevis.compress([src], tmp_path / "two.brv", threads=2, processes=True, chunk_bytes=1 << 16)
    assert (tmp_path / "two.brv").read_bytes() == (tmp_path / "one.brv").read_bytes()


# ------------------------------------------------------------ minor
def test_ls_and_inspect_escape_names(tmp_path, seed):
    evil = "red\x1b[31mname\nsecond line\x07"

    def edit(index):
        index["files"][0]["path"] = evil

    path = craft(tmp_path, seed, edit)
    for command in ("ls", "inspect"):
        r = cli(command, path, env=STRICT)
        assert r.returncode == 0, r.stderr
        assert "\x1b" not in r.stdout and "\x07" not in r.stdout
        assert "red\\x1b[31mname\\nsecond line\\x07" in r.stdout
        assert not any(line.startswith("second line") for line in r.stdout.splitlines())


def test_sparse_input_comes_back_sparse(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    big = src / "sparse.bin"
    with open(big, "wb") as f:
        f.write(b"head")
        f.truncate(64 << 20)
        f.seek(40 << 20)
        f.write(b"middle")
    brevis.compress([src], tmp_path / "a.brv")
    brevis.decompress(tmp_path / "a.brv", tmp_path / "out")
    got = tmp_path / "out" / "sparse.bin"
    assert tree(tmp_path / "out") == tree(src)
    st = got.stat()
    if big.stat().st_blocks * 512 >= st.st_size:
        pytest.skip("this file system does not keep holes")
    assert st.st_blocks * 512 < (8 << 20), f"{st.st_blocks * 512} bytes allocated for a 64 MiB sparse file"


# ------------------------------------------------------------ timestamps no file system can hold
@pytest.mark.parametrize("mtime", [10**30, -(10**30), 1 << 63])
def test_an_mtime_no_file_system_holds_is_refused_in_one_line(tmp_path, seed, mtime):
    """os.utime raised OverflowError after every file was written (exit 70)."""
    path = craft(tmp_path, seed, lambda index: index["files"][0].update(mtime=mtime))
    with pytest.raises(FormatError, match="malformed mtime"):
        brevis.open(path)
    one_line_error(cli("decompress", path, "-o", tmp_path / "out"), 3)
    assert not (tmp_path / "out").exists()
