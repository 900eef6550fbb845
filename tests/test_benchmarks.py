"""The benchmark harness, end to end, on a tiny synthetic corpus."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

ROOT = Path(__file__).resolve().parent.parent
CODECS = ["brevis", "zstd-3", "zstd-19", "gzip-9", "xz-6"]  # stdlib, brevis and zstd: no torch needed
MODES = ["memory", "tmpfs", "disk", "cpu"]


def tmpfs_or(tmp_path) -> str:
    return "/dev/shm" if Path("/dev/shm").is_dir() else str(tmp_path)


def tiny_corpus(tmp_path) -> Path:
    item = tmp_path / "corpus" / "tiny"
    item.mkdir(parents=True)
    rng = np.random.default_rng(0)
    save_file({"w": rng.standard_normal((64, 96)).astype(np.float32),
               "h": rng.standard_normal(500).astype(np.float16),
               "q": rng.integers(-128, 128, 1000, dtype=np.int8)}, str(item / "model.safetensors"))
    (item / "config.json").write_text('{"hidden": 96}\n')
    (item / "SOURCE.json").write_text("{}\n")  # not part of the item
    return tmp_path / "corpus"


def test_harness_round_trips_every_codec(tmp_path):
    corpus = tiny_corpus(tmp_path)
    out = tmp_path / "results"

    p = subprocess.run([sys.executable, "benchmarks/run.py", str(corpus), "--codecs", ",".join(CODECS),
                        "--threads", "2", "--out", str(out), "--tmp", str(tmp_path), "--tmpfs", tmpfs_or(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr

    res = json.loads((out / "latest.json").read_text())
    assert [c["name"] for c in res["codecs"]] == CODECS and res["modes"] == MODES
    assert res["failures"] == [] and res["skipped"] == {}
    [it] = res["items"]
    assert it["name"] == "tiny" and sorted(Path(f).name for f in it["files"]) == ["config.json", "model.safetensors"]
    for name in CODECS:
        r = it["results"][name]
        assert r["status"] == "ok", (name, r)
        assert 0 < r["ratio"] < 1.1 and r["compress_mb_s"] > 0 and r["decompress_mb_s"] > 0
        assert r["compress_peak_mib"] > 1 and r["decompress_peak_mib"] > 1
        assert set(r["runs"]) == set(MODES) and r["checked_by"] == ["sha256"]
        assert r["runs"]["cpu"]["threads"] == 1 and r["runs"]["memory"]["threads"] == 2
        for mode in ("memory", "tmpfs", "disk"):
            assert r[f"compress_mb_s_{mode}"] > 0 and r[f"decompress_mb_s_{mode}"] > 0
        assert r["compress_cpu_s_per_gb"] > 0 and r["decompress_cpu_s_per_gb"] > 0
        # The file-to-file figures without a suffix are those on disk, as before.
        assert r["compress_mb_s"] == r["compress_mb_s_disk"]
        o = res["overall"][name]
        assert o["items"] == 1 and o["compress_mb_s_memory"] > 0 and o["decompress_cpu_s_per_gb"] > 0
    # The float tensors' fields are counted separately: random normals leave the
    # low mantissa bytes nearly 8 bits each, but the exponents far below.
    assert 0.5 < it["entropy_ratio"] < 1.0 and it["float_tensor_bytes"] == 64 * 96 * 4 + 500 * 2
    md = (out / "latest.md").read_text()
    assert "| brevis" in md.lower() and "| c MB/s mem | c MB/s tmpfs | c MB/s disk | d MB/s mem |" in md
    assert "CPU seconds per GB, one thread" in md
    # Issue 14's startup: fresh `brevis` processes, each command timed.
    assert [r["what"].split()[0] for r in res["startup"]] == ["brevis", "compress", "decompress", "compress"]
    assert all(0 < r["best_s"] <= r["median_s"] and r["runs"] == 5 for r in res["startup"])
    assert "## Startup" in md and "| brevis --help |" in md


def test_brevis_imports_before_the_clock_what_its_calls_import(tmp_path):
    """The harness's worker imports a codec's modules before the clock:
    for Brevis, every module a compression (on worker processes too), an
    unpack and a decompression import on first use, so none is imported
    inside the timed part."""
    corpus = tiny_corpus(tmp_path)
    code = f"""
import importlib, sys
sys.path.insert(0, {str(ROOT)!r})
from benchmarks.codecs import BY_NAME
for m in ("numpy", *BY_NAME["brevis"].imports):
    importlib.import_module(m)
before = set(sys.modules)
import brevis
brevis.compress({str(corpus / "tiny")!r}, {str(tmp_path / "a.brv")!r}, threads=2, processes=True)
brevis.compress({str(corpus / "tiny")!r}, {str(tmp_path / "b.brv")!r})
brevis.unpack(open({str(tmp_path / "a.brv")!r}, "rb").read(), threads=2)
brevis.decompress({str(tmp_path / "a.brv")!r}, {str(tmp_path / "out")!r}, threads=2)
print(sorted(set(sys.modules) - before))
"""
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    late = eval(p.stdout.strip().splitlines()[-1])
    assert not [m for m in late if m.startswith(("brevis", "multiprocessing", "concurrent"))], late


def test_harness_one_thread_reuses_the_in_memory_pass(tmp_path):
    corpus = tiny_corpus(tmp_path)
    out = tmp_path / "results"
    p = subprocess.run([sys.executable, "benchmarks/run.py", "--corpus", str(corpus), "--codecs", "brevis,zstd-3",
                        "--modes", "cpu,memory", "--threads", "1", "--out", str(out), "--tmpfs", tmpfs_or(tmp_path),
                        "--no-startup"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    res = json.loads((out / "latest.json").read_text())
    assert res["modes"] == ["memory", "cpu"]
    for r in res["items"][0]["results"].values():
        assert r["runs"]["cpu"]["same_as"] == "memory" and r["compress_cpu_s_per_gb"] > 0
        assert "compress_mb_s" not in r  # no file-to-file pass
    assert "c MB/s disk" not in (out / "latest.md").read_text()
    assert res["startup"] is None


def test_harness_keeps_the_median_and_mean_runs_beside_the_best(tmp_path):
    corpus = tiny_corpus(tmp_path)
    out = tmp_path / "results"
    p = subprocess.run([sys.executable, "benchmarks/run.py", "--corpus", str(corpus), "--codecs", "brevis,zstd-3",
                        "--modes", "memory", "--threads", "2", "--repeat", "3", "--out", str(out),
                        "--tmpfs", tmpfs_or(tmp_path), "--no-startup"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    res = json.loads((out / "latest.json").read_text())
    for name, r in res["items"][0]["results"].items():
        run = r["runs"]["memory"]
        for what in ("compress", "decompress"):
            for stat in ("median", "mean"):
                assert 0 < run[f"{what}_s"] <= run[f"{what}_s_{stat}"], (name, what, stat)
                assert r[f"{what}_mb_s_memory"] >= r[f"{what}_mb_s_memory_{stat}"] > 0
                overall = res["overall"][name]
                assert overall[f"{what}_mb_s_memory"] >= overall[f"{what}_mb_s_memory_{stat}"] > 0
    md = (out / "latest.md").read_text()
    assert "best of 3 runs each" in md
    assert "## Decompression MB/s per item, median of 3 runs (in memory)" in md
    assert "## Decompression MB/s per item, mean of 3 runs (in memory)" in md


@pytest.mark.parametrize("name", ["zstd-3", "gzip-9", "xz-6", "brotli-9", "lz4", "zipnn", "pcodec-8", "blosc2"])
def test_peer_round_trips_in_memory_and_file_to_file(tmp_path, monkeypatch, name):
    """Each peer, in this process: in memory and file to file, with an odd
    length, a tensor at an unaligned offset and an empty file."""
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks.codecs import BY_NAME

    codec = BY_NAME[name]
    if codec.available():
        pytest.skip(codec.available())
    rng = np.random.default_rng(1)
    files = [tmp_path / "a.safetensors", tmp_path / "b.bin", tmp_path / "c.bin"]
    save_file({"w": (rng.standard_normal((40, 50)) * 0.02).astype(np.float32),
               "z": rng.standard_normal(333).astype(np.float16)}, str(files[0]))
    files[1].write_bytes(files[0].read_bytes()[:-1])  # opaque to the parsers: odd length
    files[2].write_bytes(b"")
    dtypes = [{"F32": 8000, "F16": 666}, {"F32": 8000}, {"F32": 0}]
    if codec.unsupported(files, dtypes):
        files, dtypes = files[:2], dtypes[:2]
    names = [f.name for f in files]
    originals = [f.read_bytes() for f in files]
    codec.begin(2)
    metas = codec.prepare(files, dtypes)

    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    codec.compress(files, names, metas, work, 2)
    codec.decompress(work, names, out, 2)
    assert [(out / n).read_bytes() for n in names] == originals

    mem = tmp_path / "mem"
    mem.mkdir()
    kept = codec.compress_memory(files, [bytearray(b) for b in originals], names, metas, mem, 2)
    codec.save(kept, names, mem)
    back = codec.decompress_memory(codec.load(mem, names), names, 2)
    assert [b"".join(bytes(memoryview(p).cast("B")) for p in parts) for parts in back] == originals


def test_float_fields_cover_every_bit(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks.entropy import float_fields

    # (shift, width): sign, exponent, then mantissa bytes from the low end
    assert float_fields(8, 23) == [(31, 1), (23, 8), (0, 8), (8, 8), (16, 7)]  # F32
    assert float_fields(8, 7) == [(15, 1), (7, 8), (0, 7)]  # BF16
    assert float_fields(5, 10) == [(15, 1), (10, 5), (0, 8), (8, 2)]  # F16


def test_coder_tables_on_a_tiny_checkpoint(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import coder_tables

    # The two field streams: exponent, then sign bit over the 7 high mantissa bits.
    x = np.array([1.0, -1.5, 2.0], dtype=np.float32).view(np.uint32)
    streams = coder_tables.field_streams(x, 8, 23)
    assert streams["exponent"][0].tolist() == [127, 127, 128] and streams["exponent"][1] == 256
    assert streams["sign+mantissa"][0].tolist() == [0, 0xC0, 0]
    h = np.array([-1.5], dtype=np.float16).view(np.uint16)
    assert [s.tolist() for s, _ in coder_tables.field_streams(h, 5, 10).values()] == [[15], [0xC0]]

    item = tmp_path / "corpus" / "tiny"
    item.mkdir(parents=True)
    rng = np.random.default_rng(0)
    tensors = {f"w{i}": (rng.standard_normal((64, 96)) * 0.02).astype(np.float32) for i in range(6)}
    tensors["small"] = rng.standard_normal(500).astype(np.float16)  # 1000 bytes: not measured
    save_file(tensors, str(item / "model.safetensors"))
    out = tmp_path / "results"
    assert coder_tables.main([str(tmp_path / "corpus"), "--out", str(out)]) == 0

    res = json.loads((out / "coder_tables.json").read_text())
    [row] = res["items"]
    for field in coder_tables.FIELDS:
        t = row["streams"]["fields"][field]["all"]
        assert t["streams"] == 6 and t["raw"] == 6 * 64 * 96  # one chunk per tensor, one byte per element
        assert t == row["streams"]["fields"][field]["small"] | {
            m: t[m] for m in ("dict1k", "dict4k", "static", "choice", "best")}  # only one-time bytes differ
        assert t["entropy"] <= t["own"] and t["entropy"] <= t["static"]
    ix = row["index"]
    assert 0 < ix["index_stored"] == ix["recompressed"] < ix["archive"] and ix["programs_json"] > 0
    assert "### Index" in (out / "coder_tables.md").read_text()


def test_coder_kernels_times_each_step_against_another_build(tmp_path, monkeypatch, capsys):
    """Every step timed for both value widths; the build compared with
    itself codes every block alike (else the script stops)."""
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import coder_kernels
    from brevis.native import _rans

    item = tmp_path / "corpus" / "tiny"
    item.mkdir(parents=True)
    rng = np.random.default_rng(0)
    (rng.standard_normal(600_000) * 0.02).astype(np.float32).tofile(item / "weights.bin")  # 2.4 MB
    assert coder_kernels.main([str(tmp_path / "corpus"), "--items", "tiny", "--against", _rans.__file__,
                               "--rounds", "1", "--repeat", "1"]) == 0
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| tiny")]
    assert [(r[1], r[2]) for r in rows] == [(kind, step) for kind in ("16-bit", "bytes", "23-bit")
                                            for step in ("encode_block", "trie_values", "decode_stream",
                                                         "decode_streams")]
    assert all(float(r[3]) > 0 and float(r[4].rstrip(" |")) > 0 for r in rows)


def test_engine_batches_replays_the_narrow_calls_merged(tmp_path, monkeypatch, capsys):
    """The narrow streams' calls of an unpack, recorded and replayed as they
    came and merged: every count of calls merged timed, each stream decoding
    again (replay raises where one does not)."""
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import engine_batches

    import brevis

    corpus = tiny_corpus(tmp_path)
    brevis.compress([str(corpus / "tiny" / "model.safetensors")], tmp_path / "t.brv")
    calls = engine_batches.recorded_calls((tmp_path / "t.brv").read_bytes())
    narrow = [c for c in calls if all(engine_batches.narrow(s[0]) for s in c)]
    assert narrow and all(len(s) == 5 and s[1] > 0 and s[4].nbytes > 0 for c in narrow for s in c)
    for k in (1, 2):  # replayed, the streams decode again (else replay raises)
        assert engine_batches.replay(narrow, [k], 1)[k] > 0
    assert engine_batches.main([str(corpus), "--items", "tiny", "--merge", "1,3", "--repeat", "2"]) == 0
    [row] = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| tiny")]
    assert int(row[2]) >= 1 and int(row[4]) > 0 and float(row[5]) > 0 and float(row[6].rstrip(" |")) > 0
    assert engine_batches.main([str(corpus), "--items", "nothing"]) == 2


def test_map_lock_times_the_mmap_calls_beside_each_way_of_faulting(monkeypatch, capsys):
    """Both ways fault the whole buffer in (its bytes kept) while the loop's
    mmap calls are timed; a row per way and round."""
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import map_lock
    from brevis.workers import heap

    if not sys.platform.startswith("linux") or heap._layout is None:
        assert map_lock.main(["--mib", "4", "--rounds", "1"]) == 2
        return
    ways = 0
    for fault in (map_lock.by_madvise, map_lock.by_prefault):
        buf = np.full(5 << 20, 3, np.uint8)
        try:
            fault(buf)
        except OSError:  # a kernel before 5.14: madvise refuses (the script leaves it out)
            assert fault is map_lock.by_madvise
            continue
        ways += 1
        assert np.all(buf == 3)
        s = map_lock.one_round(fault, 8)
        assert s["calls"] >= 1 and 0 <= s["median"] <= s["p99"] <= s["longest"] and s["ms"] > 0
    # a faulting done before the loop's first check still gets a timed call (CI's stop 65 got none)
    s = map_lock.one_round(lambda buf: None, 1)
    assert s["calls"] >= 1 and s["median"] > 0
    assert map_lock.main(["--mib", "8", "--rounds", "2"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("| madvise", "| prefault"))]
    assert len(rows) == 2 * ways


def test_unpack_profile_counts_the_unpack_window_only(tmp_path, monkeypatch, capsys):
    """Samples inside the unpack's window count, by function and library;
    without perf the script says so and exits 2."""
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import unpack_profile

    data = tmp_path / "run.data"
    data.write_bytes(b"")
    script = ("  10.000100:  ffffffff815e727a clear_page_erms ([kernel.kallsyms])\n"
              "  10.000200:      7f5610f59060 wide_zmm (/x/brevis/native/_rans.cpython-311-x86_64-linux-gnu.so)\n"
              "  10.000300:      7f5610f59060 _PyEval_EvalFrameDefault (/usr/lib/libpython3.11.so.1.0)\n"
              "  12.000000:      7f5610f59060 wide_zmm (/x/_rans.cpython-311-x86_64-linux-gnu.so)\n")
    monkeypatch.setattr(unpack_profile.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=script, stderr=""))
    found = unpack_profile.samples_in_window(data, 10.0, 11.0)
    assert found == {("clear_page_erms", "[kernel.kallsyms]"): 1, ("_PyEval_EvalFrameDefault", "libpython3.11.so.1.0"): 1,
                     ("wide_zmm", "_rans.cpython-311-x86_64-linux-gnu.so"): 1}
    assert [unpack_profile.library(d) for _, d in found] == ["kernel", "_rans", "Python"]
    monkeypatch.undo()
    monkeypatch.setattr(unpack_profile.shutil, "which", lambda name: None)
    assert unpack_profile.main(["--items", "x"]) == 2
    assert "perf is not installed" in capsys.readouterr().err


@pytest.mark.skipif(__import__("shutil").which("perf") is None, reason="perf (linux-tools) not installed")
def test_unpack_profile_on_a_tiny_checkpoint(tmp_path, monkeypatch, capsys):
    """Two fresh processes unpack its archive under perf: a table of where the window's CPU went."""
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import unpack_profile

    if unpack_profile.perf_usable():
        pytest.skip(unpack_profile.perf_usable())
    item = tmp_path / "corpus" / "tiny"
    item.mkdir(parents=True)
    rng = np.random.default_rng(0)
    save_file({"w": (rng.standard_normal((512, 1024)) * 0.02).astype(np.float16)}, str(item / "model.safetensors"))
    assert unpack_profile.main([str(tmp_path / "corpus"), "--items", "tiny", "--runs", "2"]) == 0
    out = capsys.readouterr().out
    assert "### tiny" in out and "| function | library | share | ms a run |" in out
    assert re.search(r"unpack window [\d.]+ ms", out)
    # The file-to-file pass instead: decompress into a folder it removes after.
    outs = tmp_path / "outs"
    outs.mkdir()
    assert unpack_profile.main([str(tmp_path / "corpus"), "--items", "tiny", "--runs", "2", "--mode", "decompress",
                                "--out-dir", str(outs)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# One-shot decompress") and re.search(r"decompress window [\d.]+ ms", out)
    assert not any(outs.iterdir())
    # The compression of the item instead, its archive on --out-dir, removed after.
    assert unpack_profile.main([str(tmp_path / "corpus"), "--items", "tiny", "--runs", "2", "--mode", "compress",
                                "--out-dir", str(outs)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# One-shot compress") and re.search(r"compress window [\d.]+ ms", out)
    assert not any(outs.iterdir())
    # Page faults instead of the CPU clock: the unpack touches its output's pages at least.
    assert unpack_profile.main([str(tmp_path / "corpus"), "--items", "tiny", "--runs", "2", "--faults"]) == 0
    out = capsys.readouterr().out
    faults = re.search(r"page faults in it (\d+) a run", out)
    assert "| function | library | share | faults a run |" in out and faults
    assert int(faults.group(1)) > 10


def test_unpack_stages_splits_each_call_into_its_stages(tmp_path, monkeypatch, capsys):
    """Two fresh processes, two unpacks each: the index, the decoding and
    the rest add up to the call; the second call finds the index read."""
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import unpack_stages

    corpus = tiny_corpus(tmp_path)
    runs = []
    real = unpack_stages.run_once
    monkeypatch.setattr(unpack_stages, "run_once", lambda *a: runs.append(real(*a)) or runs[-1])
    assert unpack_stages.main([str(corpus), "--items", "tiny", "--runs", "2", "--calls", "2"]) == 0
    out = capsys.readouterr().out
    assert "### tiny" in out and "| call | index | decode | rest | total |" in out
    assert re.search(r"\| first \| [\d.]+ \(\d+\) \|", out) and "| #2 |" in out
    assert len(runs) == 2 and all(len(calls) == 2 for calls in runs)
    for first, second in runs:
        for call in (first, second):
            assert call["index"][0] > 0 and call["decode"][0] > 0
            assert call["index"][0] + call["decode"][0] + call["rest"][0] == pytest.approx(call["total"][0])
        assert second["index"][0] < first["index"][0]  # the reader kept the index it read
    with pytest.raises(SystemExit, match="no item"):
        unpack_stages.main([str(corpus), "--items", "absent", "--runs", "1"])


def test_race_names_the_fastest_peer_and_tallies_the_items(tmp_path, capsys, monkeypatch):
    """Brevis against the fastest peer that raced on each item, the faster
    in bold; overall only against peers that ran every item."""
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import race

    def result(best, median, mean, items=None):
        r = {"decompress_mb_s_memory": best, "decompress_mb_s_memory_median": median,
             "decompress_mb_s_memory_mean": mean}
        return r if items is None else dict(r, items=items)

    run = {"codecs": [{"name": "brevis"}, {"name": "zstd-3"}, {"name": "zipnn"}], "modes": ["memory"],
           "brevis_revision": "abc1234", "date": "2026-12-05", "threads": 2, "repeat": 3,
           "items": [{"name": "a", "results": {"brevis": result(900, 800, 700), "zstd-3": result(500, 500, 500),
                                               "zipnn": result(1000, 700, 650)}},
                     {"name": "b", "results": {"brevis": result(300, 300, 300), "zstd-3": result(200, 200, 200)}}],
           "overall": {"brevis": result(600, 550, 500, 2), "zstd-3": result(350, 350, 350, 2),
                       "zipnn": result(1000, 700, 650, 1)}}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    assert race.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "| a | 900 / **1000 (zipnn)** | **800** / 700 (zipnn) | **700** / 650 (zipnn) |" in out
    assert "| b | **300** / 200 (zstd-3) |" in out
    assert "| overall | **600** / 350 (zstd-3) |" in out  # ZipNN's overall covers one item of two
    assert "- memory, best: ahead on 1 of 2; behind on a 900 / 1000" in out
    assert "- memory, median: ahead on 2 of 2" in out
    assert race.main([str(path), "--peers", "pcodec-8"]) == 2
    assert race.main([str(path), "--modes", "tmpfs"]) == 2


def test_phases_times_each_phase_and_the_floor(tmp_path):
    item = tmp_path / "corpus" / "tiny"
    item.mkdir(parents=True)
    rng = np.random.default_rng(0)
    save_file({"w": (rng.standard_normal((1024, 1024)) * 0.02).astype(np.float32)}, str(item / "model.safetensors"))
    p = subprocess.run([sys.executable, "benchmarks/phases.py", "--items", "tiny", "--repeat", "1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "BREVIS_CORPUS": str(tmp_path / "corpus")})
    assert p.returncode == 0, p.stderr
    [row] = [line for line in p.stdout.splitlines() if line.startswith("| tiny |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    from benchmarks.phases import FLOOR, PHASES
    n = len(PHASES)
    total, phases = float(cells[2]), [float(c) for c in cells[3:3 + n]]
    assert total > 0 and phases[PHASES.index("encode")] > 0  # chunks were encoded, and timed
    assert sum(phases) <= total + 0.005 * n  # figures rounded to 0.01 s each
    floor = [float(v) for v in cells[4 + n].split("+")]
    assert len(floor) == len(FLOOR) and all(v >= 0 for v in floor) and abs(sum(floor) - float(cells[5 + n])) < 0.02


def test_discovery_effort_measures_three_archives_per_item(tmp_path):
    corpus, out = tiny_corpus(tmp_path), tmp_path / "out"
    p = subprocess.run([sys.executable, "benchmarks/discovery_effort.py", "--corpus", str(corpus), "--out", str(out),
                        "--threads", "1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    [row] = json.loads((out / "discovery_effort.json").read_text())["items"]
    sizes = {mode: m["archive_bytes"] for mode, m in row["modes"].items()}
    assert set(sizes) == {"default", "effort 3", "parsers off"} and all(0 < s < row["original_bytes"] for s in sizes.values())
    # the safetensors file read as bytes (no tensor names) codes to other streams than the parsed one
    assert sizes["parsers off"] != sizes["default"]
    assert "| tiny |" in (out / "discovery_effort.md").read_text()


def test_scaling_measures_each_jobs_count_and_concurrent_runs(tmp_path):
    corpus = tiny_corpus(tmp_path)
    p = subprocess.run([sys.executable, "benchmarks/scaling.py", "--jobs", "1,2", "--concurrent", "1,2", "--items", "tiny",
                        "--repeat", "1", "--tmp", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "BREVIS_CORPUS": str(corpus)})
    assert p.returncode == 0, p.stderr  # a -jN whose archive differs from -j1's fails the run
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in p.stdout.splitlines()
            if line.startswith("| tiny |")]
    jobs = [(r[2], r[3]) for r in rows if len(r) == 16]
    assert jobs == [("compress", "1"), ("compress", "2"), ("decompress", "1"), ("decompress", "2")]
    assert all(float(r[4]) > 0 and r[6] == "1.00x" for r in rows if len(r) == 16 and r[3] == "1")
    concurrent = [(r[2], r[3]) for r in rows if len(r) == 10]
    assert concurrent == [("compress", "1"), ("compress", "2"), ("decompress", "1"), ("decompress", "2")]
    assert all(float(r[5]) > 0 and float(r[6]) > 0 for r in rows if len(r) == 10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]  # archives and outputs cleaned up


def test_ab_races_two_trees_in_turns(tmp_path, monkeypatch, capsys):
    """The checkout against itself (no worktree to build): a row per item
    with each side's mean / median / best and B / A, in each mode (and
    compress: whether the archives are the same bytes, else their sizes); an
    unknown revision and an item not in the corpus exit 2, saying why."""
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import ab

    item = tmp_path / "corpus" / "tiny"
    item.mkdir(parents=True)
    rng = np.random.default_rng(0)
    save_file({"w": (rng.standard_normal((256, 512)) * 0.02).astype(np.float16)}, str(item / "model.safetensors"))
    for mode in ("unpack", "decompress", "compress"):
        assert ab.main([".", ".", str(tmp_path / "corpus"), "--items", "tiny", "--runs", "2", "--mode", mode,
                        "--out-dir", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        assert f"# {mode}, . (A) against . (B): 2 fresh processes each" in out
        same = r" same bytes \|" if mode == "compress" else ""  # compress: the four archives compared
        assert re.search(r"^\| tiny \| [\d.]+ / [\d.]+ / [\d.]+ \| [\d.]+ / [\d.]+ / [\d.]+ \| [\d.]+ \|" + same + "$",
                         out, re.M)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]  # the outputs removed
    # archives that differ: each side's size and B's over A's; a side whose runs differ, its range
    assert ab.archives_cell({("x", 1000)}, {("y", 990)}) == "1,000 / 990 (-1.0000 %)"
    assert ab.archives_cell({("x", 1000), ("z", 1002)}, {("x", 1000)}) == \
        "1,000-1,002 (2 different) / 1,000 (-0.1996 %)"
    assert ab.main(["no-such-revision", ".", str(tmp_path / "corpus"), "--items", "tiny"]) == 2
    assert "'no-such-revision' is not a revision" in capsys.readouterr().err
    assert ab.main([".", ".", str(tmp_path / "corpus"), "--items", "tiny,absent"]) == 2
    err = capsys.readouterr().err
    assert "not in" in err and "absent" in err and "tiny" not in err


def test_peak_memory_round_trips_a_bf16_file_and_cleans_up(tmp_path, monkeypatch):
    """A file of 0.002 GB: compress and decompress rows with their peak
    RSS, the file back byte for byte, nothing left under --tmp; the file
    it writes is BF16 safetensors that the parser reads as 17 tensors."""
    p = subprocess.run([sys.executable, "benchmarks/peak_memory.py", "--gb", "0.002", "--tmp", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    rows = {r[0]: r for r in ([c.strip() for c in line.strip("|").split("|")] for line in p.stdout.splitlines()
                              if line.startswith("| compress") or line.startswith("| decompress"))}
    assert set(rows) == {"compress", "decompress"} and all(float(r[3]) > 0 for r in rows.values())
    assert "decompressed byte for byte: yes" in p.stdout
    assert list(tmp_path.iterdir()) == []

    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks.peak_memory import TENSORS, write_bf16_safetensors
    from safetensors import safe_open

    path = tmp_path / "m.safetensors"
    write_bf16_safetensors(path, 34_000)  # 1000 values a tensor
    with safe_open(str(path), "np") as f:
        assert len(f.keys()) == TENSORS
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + length])
    assert length % 8 == 0 and {v["dtype"] for v in header.values()} == {"BF16"}
    assert len(data) == 8 + length + TENSORS * 2000
