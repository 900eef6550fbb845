/* What the C kernels (_rans.c, _layout.c) share. */
#ifndef BREVIS_NATIVE_COMMON_H
#define BREVIS_NATIVE_COMMON_H

#include <stdint.h>

/* Items need not be aligned to their width (a tensor at an odd offset of its
 * file, as ONNX lays them out, is decoded in its place; a stream stored raw
 * lies at any byte of the archive): every load and store of an item goes
 * through these, which the compiler may not assume aligned. */
typedef uint16_t __attribute__((aligned(1))) u16u;
typedef uint32_t __attribute__((aligned(1))) u32u;
typedef uint64_t __attribute__((aligned(1))) u64u;

/* NAME(): whether the CPU has FEATURE (GCC's and clang's names: "avx2",
 * "bmi2"), asked once. x86 only. */
#define CPU_HAS(NAME, FEATURE) \
static int NAME##_known = -1; \
static int NAME(void) { \
    if (NAME##_known < 0) { __builtin_cpu_init(); NAME##_known = __builtin_cpu_supports(FEATURE) ? 1 : 0; } \
    return NAME##_known; \
}

#endif
