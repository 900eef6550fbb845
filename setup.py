"""The compiled kernels; everything else is declared in pyproject.toml."""

import platform

from setuptools import Extension, setup

# _rans.c includes xxHash 0.8.4 (vendored from the xxhash 4.1.0 sdist:
# brevis/native/xxhash/, BSD 2-clause); on x86-64 with its dispatcher, which
# picks SSE2, AVX2 or AVX-512 at run time (twice SSE2's speed on a chunk in
# cache here). _chunking.c inlines it too, for short pieces (no dispatch).
XXHASH = "brevis/native/xxhash/"
x86 = platform.machine().lower() in ("x86_64", "amd64")
setup(ext_modules=[
    Extension("brevis.native._rans", ["brevis/native/_rans.c"] + ([XXHASH + "xxh_x86dispatch.c"] if x86 else []),
              extra_compile_args=["-O3"], define_macros=[("BREVIS_XXH_DISPATCH", "1")] if x86 else [],
              depends=["brevis/native/common.h", XXHASH + "xxhash.h", XXHASH + "xxh_x86dispatch.h"]),
    Extension("brevis.native._layout", ["brevis/native/_layout.c"], extra_compile_args=["-O3"],
              depends=["brevis/native/common.h"]),
    Extension("brevis.native._index", ["brevis/native/_index.c"], extra_compile_args=["-O3"]),
    Extension("brevis.native._chunking", ["brevis/native/_chunking.c"], extra_compile_args=["-O3"],
              depends=[XXHASH + "xxhash.h"]),
])
