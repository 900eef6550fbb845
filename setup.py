"""The compiled kernels; everything else is declared in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[
    # _rans.c includes xxHash (vendored, header only: brevis/native/xxhash/, BSD 2-clause)
    Extension("brevis.native._rans", ["brevis/native/_rans.c"], extra_compile_args=["-O3"],
              depends=["brevis/native/xxhash/xxhash.h"]),
    Extension("brevis.native._layout", ["brevis/native/_layout.c"], extra_compile_args=["-O3"]),
    Extension("brevis.native._chunking", ["brevis/native/_chunking.c"], extra_compile_args=["-O3"]),
])
