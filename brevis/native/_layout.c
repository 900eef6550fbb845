/* Layout kernels: a tiled transpose for the `transpose` operator and the
 * running sums and xors and the unzigzag that undo `delta`, `xor_delta`
 * and `zigzag` (brevis/dsl/delta.py), the classify and scatter_join that undo
 * `partition` and the lookup and patch that undo `rank` (brevis/dsl/
 * symbols.py), the column copies of `records` both ways, the join of bit
 * ranges that undoes fields and the unpack that undoes `pack_bits`
 * (brevis/dsl/fields.py), the interleave that undoes `byte_planes`
 * (brevis/dsl/planes.py). Each is one pass over its output, where numpy
 * took one pass per part and temporaries of the output's size.
 *
 * Also the two calls of brevis/workers/heap.py (mallopt, madvise), here
 * because every command loads this module anyway: through ctypes they
 * cost 50 us a process (dlopen and a lookup), and a module of their own
 * 0.16-0.25 ms to load; and the walk over a GGUF header's length-prefixed
 * strings (brevis/formats/gguf.py), for the same reason.
 *
 * numpy copies a transposed view element by element in the order of the
 * output, reading the input a whole row apart each time: on nomic's F16
 * chunks that was 12 % of decoding. Tiles of TILE x TILE elements keep
 * both sides in cache.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <immintrin.h>
#ifdef __linux__
#include <sys/mman.h>
#include <poll.h>
#include <time.h>
#include <unistd.h>
#endif
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include "common.h"  /* u16u, u32u, u64u: items at any alignment; CPU_HAS */

#define TILE 32

/* dst's rows are filled left to right, one band of TILE rows after
 * another (the other order left each dst line half written for a whole
 * sweep: nomic's 1 MiB F16 chunks into a cold output, 0.59 -> 0.42 ms).
 * Where dst's rows lie a multiple of 1 KiB apart they share a few cache
 * sets, and writing a tile item by item into TILE of them evicted each
 * other's lines: there the tile goes through a small buffer and is
 * written one whole tile row at a time (F16 rows 6 KiB apart 1.25 -> 0.39
 * ms a MiB; elsewhere the buffer's extra pass costs more than it saves). */
#define TRANSPOSE_DIRECT(T) { \
    const T *s = src; T *d = dst; \
    for (Py_ssize_t j0 = 0; j0 < cols; j0 += TILE) { \
        Py_ssize_t j1 = j0 + TILE < cols ? j0 + TILE : cols; \
        for (Py_ssize_t i0 = 0; i0 < rows; i0 += TILE) { \
            Py_ssize_t i1 = i0 + TILE < rows ? i0 + TILE : rows; \
            for (Py_ssize_t i = i0; i < i1; i++) \
                for (Py_ssize_t j = j0; j < j1; j++) d[j * rows + i] = s[i * cols + j]; \
        } \
    } \
}
#define TRANSPOSE_BUFFERED(T) { \
    const T *s = src; T *d = dst; \
    T tile[TILE][TILE]; \
    for (Py_ssize_t j0 = 0; j0 < cols; j0 += TILE) { \
        Py_ssize_t jn = j0 + TILE < cols ? TILE : cols - j0; \
        for (Py_ssize_t i0 = 0; i0 < rows; i0 += TILE) { \
            Py_ssize_t in = i0 + TILE < rows ? TILE : rows - i0; \
            for (Py_ssize_t i = 0; i < in; i++) \
                for (Py_ssize_t j = 0; j < jn; j++) tile[j][i] = s[(i0 + i) * cols + j0 + j]; \
            for (Py_ssize_t j = 0; j < jn; j++) memcpy(d + (j0 + j) * rows + i0, tile[j], in * sizeof(T)); \
        } \
    } \
}
#define TRANSPOSE(T) { \
    if ((rows * (Py_ssize_t)sizeof(T)) % 1024) TRANSPOSE_DIRECT(T) else TRANSPOSE_BUFFERED(T) \
}

#if defined(__SSE2__)
/* Two-byte items eight by eight in SSE2 registers (x86-64's baseline):
 * eight rows of eight items in, eight columns out, in 24 unpacks, where
 * the item loops above move one item at a time (nomic's F16 chunks, 768
 * rows: 6.1 GB/s in cache before). `s` and `d` in bytes, any alignment. */
static inline void block8_u16(const uint8_t *s, Py_ssize_t sstride, uint8_t *d, Py_ssize_t dstride) {
    __m128i r0 = _mm_loadu_si128((const __m128i *)(s)), r1 = _mm_loadu_si128((const __m128i *)(s + sstride));
    __m128i r2 = _mm_loadu_si128((const __m128i *)(s + 2 * sstride)), r3 = _mm_loadu_si128((const __m128i *)(s + 3 * sstride));
    __m128i r4 = _mm_loadu_si128((const __m128i *)(s + 4 * sstride)), r5 = _mm_loadu_si128((const __m128i *)(s + 5 * sstride));
    __m128i r6 = _mm_loadu_si128((const __m128i *)(s + 6 * sstride)), r7 = _mm_loadu_si128((const __m128i *)(s + 7 * sstride));
    __m128i a0 = _mm_unpacklo_epi16(r0, r1), a1 = _mm_unpackhi_epi16(r0, r1);
    __m128i a2 = _mm_unpacklo_epi16(r2, r3), a3 = _mm_unpackhi_epi16(r2, r3);
    __m128i a4 = _mm_unpacklo_epi16(r4, r5), a5 = _mm_unpackhi_epi16(r4, r5);
    __m128i a6 = _mm_unpacklo_epi16(r6, r7), a7 = _mm_unpackhi_epi16(r6, r7);
    __m128i b0 = _mm_unpacklo_epi32(a0, a2), b1 = _mm_unpackhi_epi32(a0, a2);
    __m128i b2 = _mm_unpacklo_epi32(a1, a3), b3 = _mm_unpackhi_epi32(a1, a3);
    __m128i b4 = _mm_unpacklo_epi32(a4, a6), b5 = _mm_unpackhi_epi32(a4, a6);
    __m128i b6 = _mm_unpacklo_epi32(a5, a7), b7 = _mm_unpackhi_epi32(a5, a7);
    _mm_storeu_si128((__m128i *)(d), _mm_unpacklo_epi64(b0, b4));
    _mm_storeu_si128((__m128i *)(d + dstride), _mm_unpackhi_epi64(b0, b4));
    _mm_storeu_si128((__m128i *)(d + 2 * dstride), _mm_unpacklo_epi64(b1, b5));
    _mm_storeu_si128((__m128i *)(d + 3 * dstride), _mm_unpackhi_epi64(b1, b5));
    _mm_storeu_si128((__m128i *)(d + 4 * dstride), _mm_unpacklo_epi64(b2, b6));
    _mm_storeu_si128((__m128i *)(d + 5 * dstride), _mm_unpackhi_epi64(b2, b6));
    _mm_storeu_si128((__m128i *)(d + 6 * dstride), _mm_unpacklo_epi64(b3, b7));
    _mm_storeu_si128((__m128i *)(d + 7 * dstride), _mm_unpackhi_epi64(b3, b7));
}

/* dst's rows BAND at a time (a band is one run of dst's bytes) built in a
 * buffer of BAND_BYTES in L1 by 8 x 8 blocks, then copied out front to
 * back: dst is written in whole lines, in order, where writing the
 * blocks in place had 32 lines of 32 rows in flight for every tile. Where
 * a band of 16 rows fits (rows up to 1536): nomic's 1 MiB F16 chunks
 * (768 x 682 as decoding transposes them) 0.47 -> 0.27 ns a byte, 1024 x
 * 512 0.83 -> 0.37; at 2304 and 3072 rows (bands of 8) it was no faster. */
#define BAND_BYTES (48 << 10)
static void transpose_u16_bands(const uint8_t *src, uint8_t *dst, Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t band,
                                uint16_t *buf) {
    const u16u *s = (const u16u *)src;
    Py_ssize_t i8 = rows & ~(Py_ssize_t)7;
    for (Py_ssize_t j0 = 0; j0 < cols; j0 += band) {
        Py_ssize_t jn = j0 + band < cols ? band : cols - j0, j8 = jn & ~(Py_ssize_t)7;
        for (Py_ssize_t i = 0; i < i8; i += 8)
            for (Py_ssize_t j = 0; j < j8; j += 8)
                block8_u16(src + 2 * (i * cols + j0 + j), 2 * cols, (uint8_t *)(buf + j * rows + i), 2 * rows);
        /* the edges: rows past the last whole eight, then columns past it */
        for (Py_ssize_t i = 0; i < rows; i++)
            for (Py_ssize_t j = i < i8 ? j8 : 0; j < jn; j++) buf[j * rows + i] = s[i * cols + j0 + j];
        memcpy(dst + 2 * j0 * rows, buf, 2 * jn * rows);
    }
}

/* TRANSPOSE(u16u) with whole 8 x 8 blocks of each tile in registers, the
 * rest item by item; tiles, their order and the buffered variant as
 * above. In bands where 16 rows of dst fit one. */
static void transpose_u16(const uint8_t *src, uint8_t *dst, Py_ssize_t rows, Py_ssize_t cols) {
    /* the band's buffer from the heap, not a thread's stack (one call: 1 us against 300 for a MiB) */
    uint16_t *buf = rows && cols >= 16 && rows <= BAND_BYTES / 32 ? PyMem_RawMalloc(BAND_BYTES) : NULL;
    if (buf) {
        Py_ssize_t band = (BAND_BYTES / (2 * rows)) & ~(Py_ssize_t)7;
        transpose_u16_bands(src, dst, rows, cols, band > 64 ? 64 : band, buf);
        PyMem_RawFree(buf);
        return;
    }
    const u16u *s = (const u16u *)src;
    u16u *d = (u16u *)dst;
    int buffered = (rows * 2) % 1024 == 0;
    uint16_t tile[TILE][TILE];
    for (Py_ssize_t j0 = 0; j0 < cols; j0 += TILE) {
        Py_ssize_t jn = j0 + TILE < cols ? TILE : cols - j0;
        for (Py_ssize_t i0 = 0; i0 < rows; i0 += TILE) {
            Py_ssize_t in = i0 + TILE < rows ? TILE : rows - i0;
            Py_ssize_t i8 = in & ~(Py_ssize_t)7, j8 = jn & ~(Py_ssize_t)7;
            for (Py_ssize_t i = 0; i < i8; i += 8)
                for (Py_ssize_t j = 0; j < j8; j += 8) {
                    const uint8_t *from = src + 2 * ((i0 + i) * cols + j0 + j);
                    if (buffered) block8_u16(from, 2 * cols, (uint8_t *)&tile[j][i], 2 * TILE);
                    else block8_u16(from, 2 * cols, dst + 2 * ((j0 + j) * rows + i0 + i), 2 * rows);
                }
            /* the edges: rows past the last whole eight, then columns past it */
            for (Py_ssize_t i = 0; i < in; i++)
                for (Py_ssize_t j = i < i8 ? j8 : 0; j < jn; j++) {
                    uint16_t v = s[(i0 + i) * cols + j0 + j];
                    if (buffered) tile[j][i] = v; else d[(j0 + j) * rows + i0 + i] = v;
                }
            if (buffered)
                for (Py_ssize_t j = 0; j < jn; j++) memcpy(d + (j0 + j) * rows + i0, tile[j], in * 2);
        }
    }
}
#endif

/* Two or three rows of two-byte items (astra's BF16 chunks: three): the
 * output is their items woven together, written front to back; tiles of
 * three rows cost a loop each (1 MiB into a cold output: three rows 0.21
 * -> 0.13 ms, two 0.25 -> 0.16). */
#define WEAVE_ROWS(T, R) { \
    const T *s = src; T *d = dst; \
    for (Py_ssize_t j = 0; j < cols; j++) \
        for (int i = 0; i < (R); i++) d[j * (R) + i] = s[i * cols + j]; \
}

/* Two to eight columns (astra's BF16 conv weights: three, the forward of
 * WEAVE_ROWS): each column's items taken out at a constant stride, which
 * the compiler does in vectors; the tiles above moved one item at a time
 * (two-byte items, three columns: 1.14 -> 0.31 ns an item; 6.6 % of
 * astra's compression). */
#define UNWEAVE_COLS(T, C) { \
    const T *s = src; T *d = dst; \
    for (Py_ssize_t i = 0; i < rows; i++) \
        for (int j = 0; j < (C); j++) d[j * rows + i] = s[i * (C) + j]; \
}
#define UNWEAVE(T) switch (cols) { \
    case 2: UNWEAVE_COLS(T, 2) break; case 3: UNWEAVE_COLS(T, 3) break; case 4: UNWEAVE_COLS(T, 4) break; \
    case 5: UNWEAVE_COLS(T, 5) break; case 6: UNWEAVE_COLS(T, 6) break; case 7: UNWEAVE_COLS(T, 7) break; \
    default: UNWEAVE_COLS(T, 8) break; }

/* transpose(src, rows, cols, itemsize, dst) -> None
 * src holds rows x cols items of itemsize (1, 2, 4 or 8) bytes, row by row;
 * dst gets them column by column (cols x rows). */
static PyObject *layout_transpose(PyObject *self, PyObject *args) {
    PyObject *so, *dobj;
    Py_ssize_t rows, cols;
    int itemsize;
    if (!PyArg_ParseTuple(args, "OnniO", &so, &rows, &cols, &itemsize, &dobj)) return NULL;
    if ((itemsize != 1 && itemsize != 2 && itemsize != 4 && itemsize != 8) || rows < 0 || cols < 0
        || (cols && rows > PY_SSIZE_T_MAX / cols / 8)) {
        PyErr_SetString(PyExc_ValueError, "itemsize must be 1, 2, 4 or 8 and rows, cols >= 0");
        return NULL;
    }
    Py_buffer sb, db;
    if (PyObject_GetBuffer(so, &sb, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(dobj, &db, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) { PyBuffer_Release(&sb); return NULL; }
    Py_ssize_t bytes = rows * cols * itemsize;
    if (sb.len != bytes || db.len != bytes || sb.buf == db.buf) {
        PyBuffer_Release(&sb); PyBuffer_Release(&db);
        PyErr_SetString(PyExc_ValueError, "src and dst must be two buffers of rows * cols * itemsize bytes");
        return NULL;
    }
    const void *src = sb.buf;
    void *dst = db.buf;
    Py_BEGIN_ALLOW_THREADS
    if (itemsize == 1 && cols >= 2 && cols <= 8) UNWEAVE(uint8_t)
    else if (itemsize == 1) TRANSPOSE(uint8_t)
    else if (itemsize == 2 && rows == 3) WEAVE_ROWS(u16u, 3)
    else if (itemsize == 2 && rows == 2) WEAVE_ROWS(u16u, 2)
    else if (itemsize == 2 && cols >= 2 && cols <= 8) UNWEAVE(u16u)
    else if (itemsize == 4 && cols >= 2 && cols <= 8) UNWEAVE(u32u)
#if defined(__SSE2__)
    else if (itemsize == 2) transpose_u16(src, dst, rows, cols);
#else
    else if (itemsize == 2) TRANSPOSE(u16u)
#endif
    else if (itemsize == 4) TRANSPOSE(u32u)
    else TRANSPOSE(u64u)
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&sb);
    PyBuffer_Release(&db);
    Py_RETURN_NONE;
}

/* weave(parts, widths, dst) -> None: dst holds records of sum(widths)
 * bytes, part j widths[j] bytes of each, in order; every field put back
 * at once, the inverse of `records` taking its fields apart.
 * unweave(src, widths, parts) -> None: the other way, `records` itself.
 * Putting back a field at a time wrote each of dst's lines once a field (Q4_1's
 * three: 20-byte records, 98 MB of smollm2), and numpy's copy of a column
 * took about 3 ns a record; here a block of records has all its fields
 * copied while its lines are in L1, so that the records' memory is
 * crossed once, each field in copies of its fixed size. */
#define WEAVE_FIELDS 64
#define WEAVE_BLOCK (16 << 10)  /* bytes of records a block spans, at most (at least one record) */
#define COPY_EACH(W, TO, TO_STEP, FROM, FROM_STEP) \
    for (Py_ssize_t r = 0; r < count; r++) memcpy((TO) + r * (TO_STEP), (FROM) + r * (FROM_STEP), (W));
/* Record r's field of width W: at rec + r * stride, and at part + r * W. */
#define FIELD_COPY(W) { if (weave) COPY_EACH(W, rec, stride, part, W) else COPY_EACH(W, part, W, rec, stride) }

static void records_copy(uint8_t *records_at, uint8_t *const *parts, const Py_ssize_t *widths, Py_ssize_t k,
                         Py_ssize_t records, Py_ssize_t stride, int weave) {
    const Py_ssize_t block = stride < WEAVE_BLOCK ? WEAVE_BLOCK / stride : 1;
    for (Py_ssize_t r0 = 0; r0 < records; r0 += block) {
        const Py_ssize_t count = records - r0 < block ? records - r0 : block;
        uint8_t *rec = records_at + r0 * stride;
        for (Py_ssize_t j = 0; j < k; j++) {
            uint8_t *part = parts[j] + r0 * widths[j];
            switch (widths[j]) {  /* fixed sizes: the copies compile to loads and stores */
            case 1: FIELD_COPY(1) break;
            case 2: FIELD_COPY(2) break;
            case 4: FIELD_COPY(4) break;
            case 8: FIELD_COPY(8) break;
            case 12: FIELD_COPY(12) break;
            case 16: FIELD_COPY(16) break;
            case 32: FIELD_COPY(32) break;
            case 64: FIELD_COPY(64) break;
            case 128: FIELD_COPY(128) break;
            default: FIELD_COPY(widths[j]) break;
            }
            rec += widths[j];
        }
    }
}
#undef FIELD_COPY
#undef COPY_EACH

/* weave's and unweave's checks, and the call: `whole` the records, `po`
 * the parts (writable where !weave). */
static PyObject *records_call(PyObject *whole, PyObject *wo, PyObject *po, int weave) {
    PyObject *seq = PySequence_Fast(po, "parts must be a sequence");
    if (!seq) return NULL;
    PyObject *wseq = PySequence_Fast(wo, "widths must be a sequence");
    if (!wseq) { Py_DECREF(seq); return NULL; }
    const int writable = PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE;
    Py_buffer rb, pb[WEAVE_FIELDS];
    uint8_t *pl[WEAVE_FIELDS];
    Py_ssize_t widths[WEAVE_FIELDS];
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq), held = 0, stride = 0;
    int ok = 0, records_held = 0;
    if (k < 1 || k > WEAVE_FIELDS || PySequence_Fast_GET_SIZE(wseq) != k) {
        PyErr_SetString(PyExc_ValueError, "1 to 64 parts, a width each");
        goto release;
    }
    for (Py_ssize_t j = 0; j < k; j++) {
        widths[j] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(wseq, j));
        if (widths[j] == -1 && PyErr_Occurred()) goto release;
        if (widths[j] < 1 || widths[j] > (1 << 20)) { PyErr_SetString(PyExc_ValueError, "a width is 1 to 2^20 bytes"); goto release; }
        stride += widths[j];
    }
    if (PyObject_GetBuffer(whole, &rb, weave ? writable : PyBUF_C_CONTIGUOUS) < 0) goto release;
    records_held = 1;
    const Py_ssize_t records = rb.len / stride;
    if (records * stride != rb.len) { PyErr_SetString(PyExc_ValueError, "the records must be whole"); goto release; }
    for (; held < k; held++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, held), &pb[held], weave ? PyBUF_C_CONTIGUOUS : writable) < 0)
            goto release;
        pl[held] = pb[held].buf;
        if (pb[held].len != widths[held] * records) {
            held++;
            PyErr_SetString(PyExc_ValueError, "part j must hold widths[j] bytes a record");
            goto release;
        }
        /* either way the one written must not lie over the other */
        if ((uint8_t *)pb[held].buf < (uint8_t *)rb.buf + rb.len && (uint8_t *)rb.buf < (uint8_t *)pb[held].buf + pb[held].len) {
            held++;
            PyErr_SetString(PyExc_ValueError, "a part must not overlap the records");
            goto release;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    records_copy(rb.buf, pl, widths, k, records, stride, weave);
    Py_END_ALLOW_THREADS
    ok = 1;
release:
    for (Py_ssize_t j = 0; j < held; j++) PyBuffer_Release(&pb[j]);
    if (records_held) PyBuffer_Release(&rb);
    Py_DECREF(seq);
    Py_DECREF(wseq);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

static PyObject *layout_weave(PyObject *self, PyObject *args) {
    PyObject *po, *wo, *dobj;
    if (!PyArg_ParseTuple(args, "OOO", &po, &wo, &dobj)) return NULL;
    return records_call(dobj, wo, po, 1);
}

static PyObject *layout_unweave(PyObject *self, PyObject *args) {
    PyObject *so, *wo, *po;
    if (!PyArg_ParseTuple(args, "OOO", &so, &wo, &po)) return NULL;
    return records_call(so, wo, po, 0);
}

/* A field's (low, width) ranges, high bits first, as the shifts that put
 * its value back into a word: range r takes the value's bits from pos[r]
 * (the last range the lowest), masks them and moves them to low[r]. */
typedef struct { int count; int pos[64], low[64]; uint64_t mask[64]; int deposit; uint64_t bits; } spread_t;

static int parse_ranges(PyObject *ro, int word_bits, int value_bits, spread_t *s) {
    PyObject *seq = PySequence_Fast(ro, "ranges must be a sequence of (low, width)");
    if (!seq) return -1;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    if (count > 64) { Py_DECREF(seq); PyErr_SetString(PyExc_ValueError, "at most 64 ranges"); return -1; }
    long lows[64], widths[64], total = 0;
    for (Py_ssize_t r = 0; r < count; r++) {
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, r), "ll", &lows[r], &widths[r])) { Py_DECREF(seq); return -1; }
        if (lows[r] < 0 || widths[r] < 1 || lows[r] + widths[r] > word_bits) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "a range must lie inside dst's words");
            return -1;
        }
        total += widths[r];
    }
    Py_DECREF(seq);
    if (total > value_bits) { PyErr_SetString(PyExc_ValueError, "the ranges are wider than their field's items"); return -1; }
    s->count = (int)count;
    s->bits = 0;
    s->deposit = 1;
    long pos = 0;
    for (Py_ssize_t r = count - 1; r >= 0; r--) {
        s->pos[r] = (int)pos;
        s->low[r] = (int)lows[r];
        s->mask[r] = widths[r] >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << widths[r]) - 1);
        if (s->bits & (s->mask[r] << lows[r])) s->deposit = 0;  /* overlapping ranges: not one mask */
        s->bits |= s->mask[r] << lows[r];
        if (r < count - 1 && lows[r] <= lows[r + 1]) s->deposit = 0;
        pos += widths[r];
    }
    return 0;
}

CPU_HAS(avx2_usable, "avx2")

/* One range over all elements: dst (|)= ((src >> pos) & mask) << low, in
 * the destination's width; one loop per pair of widths so that each
 * compiles to straight shifts (the compiler vectorizes them). Words of 4
 * bytes or fewer in 32-bit arithmetic (their shifts are under 32): eight
 * lanes to an AVX2 vector, where the 64-bit form took four and widened
 * every item. */
#define PUT_RANGE(S, D) { \
    const S *v = (const S *)src; D *d = (D *)dst; \
    if (sizeof(D) <= 4) { \
        const uint32_t m = (uint32_t)mask; \
        if (first) for (Py_ssize_t i = 0; i < n; i++) d[i] = (D)((((uint32_t)v[i] >> pos) & m) << low); \
        else for (Py_ssize_t i = 0; i < n; i++) d[i] |= (D)((((uint32_t)v[i] >> pos) & m) << low); \
    } else if (first) for (Py_ssize_t i = 0; i < n; i++) d[i] = (D)((((uint64_t)v[i] >> pos) & mask) << low); \
    else for (Py_ssize_t i = 0; i < n; i++) d[i] |= (D)((((uint64_t)v[i] >> pos) & mask) << low); \
}
#define PUT_RANGE_TO(S) { \
    if (dsize == 1) PUT_RANGE(S, uint8_t) else if (dsize == 2) PUT_RANGE(S, u16u) \
    else if (dsize == 4) PUT_RANGE(S, u32u) else PUT_RANGE(S, u64u) \
}
/* A range of every width pair, compiled twice: for AVX2 and for any x86-64. */
#define JOIN_RANGE(NAME, TARGET) \
TARGET static void NAME(const void *src, Py_ssize_t ssize, void *dst, Py_ssize_t dsize, Py_ssize_t n, int pos, int low, \
                        uint64_t mask, int first) { \
    if (ssize == 1) PUT_RANGE_TO(uint8_t) \
    else if (ssize == 2) PUT_RANGE_TO(u16u) \
    else if (ssize == 4) PUT_RANGE_TO(u32u) \
    else PUT_RANGE_TO(u64u) \
}
JOIN_RANGE(join_range, )
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
JOIN_RANGE(join_range_avx2, __attribute__((target("avx2"))))
#define HAVE_JOIN_AVX2 1
#endif

/* join(src, ranges, dst, first) -> None
 * The inverse of cutting one field out of words (bit_fields, float
 * fields, partition): ranges is a list of (low, width) in the field's
 * order, high bits first; the field's lowest bits go to the last range.
 * Each range's bits are shifted to `low` of dst's words and ORed in (set,
 * with first true, for the first range of the first field). src's and
 * dst's items are 1, 2, 4 or 8 bytes, n of each. numpy took a shift, a
 * mask and an OR pass per range, with a temporary of the output's size. */
static PyObject *layout_join(PyObject *self, PyObject *args) {
    PyObject *so, *ro, *dobj;
    int first;
    if (!PyArg_ParseTuple(args, "OOOp", &so, &ro, &dobj, &first)) return NULL;
    Py_buffer sb, db;
    if (PyObject_GetBuffer(so, &sb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    if (PyObject_GetBuffer(dobj, &db, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&sb);
        return NULL;
    }
    int ok = 0;
    Py_ssize_t ssize = sb.itemsize, dsize = db.itemsize;
    spread_t s;
    if ((ssize != 1 && ssize != 2 && ssize != 4 && ssize != 8) || (dsize != 1 && dsize != 2 && dsize != 4 && dsize != 8)
        || sb.len / ssize != db.len / dsize) {
        PyErr_SetString(PyExc_ValueError, "src and dst must hold as many items of 1, 2, 4 or 8 bytes");
        goto done;
    }
    if (parse_ranges(ro, 8 * (int)dsize, 8 * (int)ssize, &s) < 0) goto done;
    const Py_ssize_t n = db.len / dsize;
    const void *src = sb.buf;
    void *dst = db.buf;
    Py_BEGIN_ALLOW_THREADS
    void (*range)(const void *, Py_ssize_t, void *, Py_ssize_t, Py_ssize_t, int, int, uint64_t, int) = join_range;
#ifdef HAVE_JOIN_AVX2
    if (avx2_usable()) range = join_range_avx2;
#endif
    for (int r = s.count - 1; r >= 0; r--) {  /* the last range holds the field's lowest bits */
        range(src, ssize, dst, dsize, n, s.pos[r], s.low[r], s.mask[r], first);
        first = 0;
    }
    Py_END_ALLOW_THREADS
    ok = 1;
done:
    PyBuffer_Release(&sb);
    PyBuffer_Release(&db);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* Byte kernels with AVX2 where the CPU has it: `partition`'s context is
 * usually a float's exponent byte, the ranks of its `rank` child four bits
 * (pack_bits), and their lookups 16 entries (one byte shuffle) or a few
 * listed values: a vector of 32 bytes where the loops took one at a time.
 *
 * dst[i] = table16[ranks[i]] for ranks below 16 (a larger one's byte is
 * undefined: the caller refuses it by the largest rank, *most); returns how
 * many ranks equal `top`. */
__attribute__((target("avx2")))
static Py_ssize_t lookup16_avx2(const uint8_t *ranks, Py_ssize_t n, const uint8_t *table16, uint8_t top,
                                uint8_t *dst, uint8_t *most) {
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)table16));
    const __m256i tops = _mm256_set1_epi8((char)top);
    __m256i high = _mm256_setzero_si256();
    Py_ssize_t escaped = 0, i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i r = _mm256_loadu_si256((const __m256i *)(ranks + i));
        high = _mm256_max_epu8(high, r);
        _mm256_storeu_si256((__m256i *)(dst + i), _mm256_shuffle_epi8(table, r));
        escaped += __builtin_popcount((unsigned)_mm256_movemask_epi8(_mm256_cmpeq_epi8(r, tops)));
    }
    uint8_t lanes[32], m = 0;
    _mm256_storeu_si256((__m256i *)lanes, high);
    for (int k = 0; k < 32; k++) if (lanes[k] > m) m = lanes[k];
    for (; i < n; i++) {
        uint8_t r = ranks[i];
        if (r > m) m = r;
        escaped += r == top;
        dst[i] = table16[r & 15];
    }
    *most = m;
    return escaped;
}

/* Four-bit lanes of `whole` packed bytes into 2 * whole bytes, the low lane first. */
__attribute__((target("avx2")))
static Py_ssize_t unpack4_avx2(const uint8_t *p, Py_ssize_t whole, uint8_t *d) {
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    Py_ssize_t b = 0;
    for (; b + 32 <= whole; b += 32) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(p + b));
        __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        __m256i a = _mm256_unpacklo_epi8(lo, hi), c = _mm256_unpackhi_epi8(lo, hi);  /* bytes 0-7 | 16-23, 8-15 | 24-31 */
        _mm256_storeu_si256((__m256i *)(d + 2 * b), _mm256_permute2x128_si256(a, c, 0x20));
        _mm256_storeu_si256((__m256i *)(d + 2 * b + 32), _mm256_permute2x128_si256(a, c, 0x31));
    }
    return b;  /* bytes done */
}

/* classes[i] = the class of context byte i where every byte value has
 * one (a table of 256): `dflt` but for the `k` listed values (values[j] ->
 * codes[j]); counts[j] += how many bytes equal values[j]. Returns the
 * bytes done (whole vectors). */
__attribute__((target("avx2")))
static Py_ssize_t classify_avx2(const uint8_t *ctx, Py_ssize_t n, const uint8_t *values, const uint8_t *codes, int k,
                                uint8_t dflt, uint8_t *cls, Py_ssize_t *counts) {
    __m256i v[16], c[16];
    for (int j = 0; j < k; j++) { v[j] = _mm256_set1_epi8((char)values[j]); c[j] = _mm256_set1_epi8((char)codes[j]); }
    const __m256i other = _mm256_set1_epi8((char)dflt);
    Py_ssize_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(ctx + i)), out = other;
        for (int j = 0; j < k; j++) {
            __m256i eq = _mm256_cmpeq_epi8(x, v[j]);
            out = _mm256_blendv_epi8(out, c[j], eq);
            counts[j] += __builtin_popcount((unsigned)_mm256_movemask_epi8(eq));
        }
        _mm256_storeu_si256((__m256i *)(cls + i), out);
    }
    return i;
}

/* Four sets of counters, element i counted in set i % 4: consecutive
 * elements of one class (the usual case) then do not wait on each other's
 * increment of one counter in memory. */
#define CLASSIFY(T) { \
    const T *v = src; \
    Py_ssize_t i = 0; \
    for (; i + 4 <= n; i += 4) { \
        if (((uint64_t)v[i] | (uint64_t)v[i + 1] | (uint64_t)v[i + 2] | (uint64_t)v[i + 3]) >= (uint64_t)tlen \
            && ((uint64_t)v[i] >= (uint64_t)tlen || (uint64_t)v[i + 1] >= (uint64_t)tlen \
                || (uint64_t)v[i + 2] >= (uint64_t)tlen || (uint64_t)v[i + 3] >= (uint64_t)tlen)) { bad = 1; break; } \
        uint8_t c0 = table[v[i]], c1 = table[v[i + 1]], c2 = table[v[i + 2]], c3 = table[v[i + 3]]; \
        cls[i] = c0; cls[i + 1] = c1; cls[i + 2] = c2; cls[i + 3] = c3; \
        sets[0][c0]++; sets[1][c1]++; sets[2][c2]++; sets[3][c3]++; \
    } \
    for (; i < n && !bad; i++) { \
        if ((uint64_t)v[i] >= (uint64_t)tlen) { bad = 1; break; } \
        uint8_t c = table[v[i]]; cls[i] = c; sets[0][c]++; \
    } \
}

/* classify(context, table, classes) -> counts
 * classes[i] = table[context[i]] (context: items of 1, 2, 4 or 8 bytes;
 * table and classes: bytes), and how many elements each of the 256 classes
 * got: what `partition` needs before it reads its parts, in one pass (a
 * numpy take, then a bincount that widens to 8 bytes an element, block by
 * block). A context value past the table is a ValueError. */
static PyObject *layout_classify(PyObject *self, PyObject *args) {
    PyObject *so, *to, *co;
    if (!PyArg_ParseTuple(args, "OOO", &so, &to, &co)) return NULL;
    Py_buffer sb, tb, cb;
    if (PyObject_GetBuffer(so, &sb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    if (PyObject_GetBuffer(to, &tb, PyBUF_C_CONTIGUOUS) < 0) { PyBuffer_Release(&sb); return NULL; }
    if (PyObject_GetBuffer(co, &cb, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&sb); PyBuffer_Release(&tb);
        return NULL;
    }
    Py_ssize_t size = sb.itemsize, n = cb.len, tlen = tb.len, counts[256] = {0}, sets[4][256] = {{0}};
    int bad = 0;
    const char *error = NULL;
    if ((size != 1 && size != 2 && size != 4 && size != 8) || sb.len != n * size)
        error = "context and classes must hold as many items (of 1, 2, 4 or 8 bytes; classes of 1)";
    else {
        const void *src = sb.buf;
        const uint8_t *table = tb.buf;
        uint8_t *cls = cb.buf;
        Py_BEGIN_ALLOW_THREADS
        /* bytes with a class for every value (a table of 256), all of one class but at most 16: listed */
        uint8_t values[16], codes[16], dflt = 0;
        int listed = -1;
        if (size == 1 && tlen == 256 && avx2_usable()) {
            Py_ssize_t seen[256] = {0};
            for (int v = 0; v < 256; v++) seen[table[v]]++;
            for (int c = 0; c < 256; c++) if (seen[c] > seen[dflt]) dflt = (uint8_t)c;
            listed = 0;
            for (int v = 0; v < 256 && listed >= 0; v++)
                if (table[v] != dflt) {
                    if (listed == 16) listed = -1;
                    else { values[listed] = (uint8_t)v; codes[listed++] = table[v]; }
                }
        }
        if (listed >= 0) {
            Py_ssize_t got[16] = {0}, done = classify_avx2(src, n, values, codes, listed, dflt, cls, got), in_list = 0;
            for (int j = 0; j < listed; j++) { sets[0][codes[j]] += got[j]; in_list += got[j]; }
            sets[0][dflt] += done - in_list;
            const uint8_t *v = src;
            for (Py_ssize_t i = done; i < n; i++) { uint8_t c = table[v[i]]; cls[i] = c; sets[0][c]++; }
        }
        else if (size == 1) CLASSIFY(uint8_t)
        else if (size == 2) CLASSIFY(u16u)
        else if (size == 4) CLASSIFY(u32u)
        else CLASSIFY(u64u)
        Py_END_ALLOW_THREADS
        if (bad) error = "a context value lies past the class table";
        for (int c = 0; c < 256; c++) counts[c] = sets[0][c] + sets[1][c] + sets[2][c] + sets[3][c];
    }
    PyBuffer_Release(&sb); PyBuffer_Release(&tb); PyBuffer_Release(&cb);
    if (error) { PyErr_SetString(PyExc_ValueError, error); return NULL; }
    PyObject *out = PyList_New(256);
    if (!out) return NULL;
    for (int c = 0; c < 256; c++) {
        PyObject *v = PyLong_FromSsize_t(counts[c]);
        if (!v) { Py_DECREF(out); return NULL; }
        PyList_SET_ITEM(out, c, v);
    }
    return out;
}

/* split_classes(classes, src, parts) -> None
 * parts[c] gets the elements src[i] with classes[i] == c, in order, each
 * part exactly as long as its class (classify's counts): `partition`'s
 * forward pass in one pass over the elements, where one comparison,
 * flatnonzero and take per class and block made about three a class.
 * src and the parts: items of one size (1, 2, 4 or 8 bytes). */
static PyObject *layout_split_classes(PyObject *self, PyObject *args) {
    PyObject *co, *so, *po;
    if (!PyArg_ParseTuple(args, "OOO", &co, &so, &po)) return NULL;
    PyObject *seq = PySequence_Fast(po, "parts must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
    if (k < 1 || k > 256) { Py_DECREF(seq); PyErr_SetString(PyExc_ValueError, "1 to 256 parts"); return NULL; }
    Py_buffer cb, sb, pb[256];
    Py_ssize_t held = 0, have[256] = {0}, used[256] = {0};
    void *dst[256];
    int got_c = 0, got_s = 0, bad = 0;
    PyObject *result = NULL;
    if (PyObject_GetBuffer(co, &cb, PyBUF_C_CONTIGUOUS) < 0) goto release;
    got_c = 1;
    if (PyObject_GetBuffer(so, &sb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto release;
    got_s = 1;
    for (; held < k; held++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, held), &pb[held],
                               PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0) goto release;
        dst[held] = pb[held].buf;
    }
    Py_ssize_t size = sb.itemsize, n = cb.len;
    if ((size != 1 && size != 2 && size != 4 && size != 8) || sb.len != n * size) {
        PyErr_SetString(PyExc_ValueError, "src must hold one item (of 1, 2, 4 or 8 bytes) a class");
        goto release;
    }
    for (Py_ssize_t j = 0; j < k; j++) {
        if (pb[j].itemsize != size || pb[j].len % size) {
            PyErr_SetString(PyExc_ValueError, "the parts must hold whole items of src's size");
            goto release;
        }
        have[j] = pb[j].len / size;
    }
    const uint8_t *cls = cb.buf;
    const void *src = sb.buf;
    Py_BEGIN_ALLOW_THREADS
#define SPLIT_CLASSES(T) { \
        const T *v = src; \
        T *out[256]; \
        for (Py_ssize_t j = 0; j < k; j++) out[j] = dst[j]; \
        for (Py_ssize_t i = 0; i < n; i++) { \
            uint8_t c = cls[i]; \
            if (c >= k || used[c] == have[c]) { bad = 1; break; } \
            out[c][used[c]++] = v[i]; \
        } }
    if (size == 1) SPLIT_CLASSES(uint8_t)
    else if (size == 2) SPLIT_CLASSES(u16u)
    else if (size == 4) SPLIT_CLASSES(u32u)
    else SPLIT_CLASSES(u64u)
#undef SPLIT_CLASSES
    Py_END_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < k; j++) bad |= used[j] != have[j];
    if (bad) { PyErr_SetString(PyExc_ValueError, "the parts do not hold the classes' elements"); goto release; }
    result = Py_None;
    Py_INCREF(result);
release:
    for (Py_ssize_t j = 0; j < held; j++) PyBuffer_Release(&pb[j]);
    if (got_s) PyBuffer_Release(&sb);
    if (got_c) PyBuffer_Release(&cb);
    Py_DECREF(seq);
    return result;
}

/* An element of 1, 2, 4 or 8 bytes at p[i], widened (the switch is on a
 * value fixed for a whole loop: the branch predicts). */
static inline uint64_t load_item(const void *p, int size, Py_ssize_t i) {
    switch (size) {
    case 1: return ((const uint8_t *)p)[i];
    case 2: return ((const u16u *)p)[i];
    case 4: return ((const u32u *)p)[i];
    default: return ((const u64u *)p)[i];
    }
}

static inline void store_item(void *p, int size, Py_ssize_t i, uint64_t v) {
    switch (size) {
    case 1: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case 2: ((u16u *)p)[i] = (uint16_t)v; break;
    case 4: ((u32u *)p)[i] = (uint32_t)v; break;
    default: ((u64u *)p)[i] = v; break;
    }
}

static inline uint64_t spread(const spread_t *s, uint64_t v) {
    uint64_t out = 0;
    for (int r = 0; r < s->count; r++) out |= ((v >> s->pos[r]) & s->mask[r]) << s->low[r];
    return out;
}

/* Where a field's ranges run from the word's high bits down (each range
 * below the one before, as a float's sign and mantissa, or its exponent),
 * spreading its value is one BMI2 deposit into the ranges' bits (pdep:
 * the value's low bits into the mask's low set bits, in order). Variable
 * shifts and masks a range cost twice as much. */
CPU_HAS(pdep_usable, "bmi2")

/* One kernel per width of part, context and word (P, X, D): every element's
 * class part read in order, bounds checked; returns whether a part ran out
 * or was not used up (1) or 0. */
#define SCATTER_DEPOSIT(NAME, P, X, D) \
__attribute__((target("bmi2"))) static int NAME(const uint8_t *cls, Py_ssize_t n, const void **src, \
                                                const Py_ssize_t *have, Py_ssize_t k, const void *ctx, \
                                                uint64_t rest_bits, uint64_t context_bits, void *dst) { \
    const P *part[256], *end[256]; \
    for (Py_ssize_t j = 0; j < 256; j++) { \
        part[j] = j < k ? (const P *)src[j] : NULL; \
        end[j] = j < k ? part[j] + have[j] : NULL; \
    } \
    const X *x = ctx; \
    D *d = dst; \
    Py_ssize_t i = 0; \
    for (; i < n; i++) { \
        const uint8_t c = cls[i]; \
        if (part[c] == end[c]) break; \
        d[i] = (D)(_pdep_u64(*part[c]++, rest_bits) | _pdep_u64(x[i], context_bits)); \
    } \
    int bad = i < n; \
    for (Py_ssize_t j = 0; j < k; j++) bad |= part[j] != end[j]; \
    return bad; \
}
SCATTER_DEPOSIT(deposit_32_8_32, u32u, uint8_t, u32u)
SCATTER_DEPOSIT(deposit_8_8_16, uint8_t, uint8_t, u16u)
SCATTER_DEPOSIT(deposit_16_8_16, u16u, uint8_t, u16u)
SCATTER_DEPOSIT(deposit_64_16_64, u64u, u16u, u64u)
#undef SCATTER_DEPOSIT

/* With AVX-512, 16 words (F32) or 32 (F16, BF16) at a time: each class's
 * next elements are loaded together and expanded into the lanes that class
 * takes (VPEXPANDD, VPEXPANDW, VPEXPANDB; a lane's class compared as a
 * byte), and the parts and the context are spread into their ranges by
 * shifts and masks, one per run of the range mask. The one-element loops
 * above keep a pointer per class in memory, loaded and stored for every
 * element: piper's F32 chunks (five classes) 1.11 -> 0.44 ns a word.
 * A block whose classes ask past a part, or name one past the parts, is
 * left to the one-element loop at the end (which refuses it). */
#define EXPAND_MOST_CLASSES 16
#define EXPAND_MOST_RUNS 4
#define T32 "avx512f,avx512bw,avx512vl,bmi2,popcnt"
#define T16 "avx512f,avx512bw,avx512vl,avx512vbmi2,bmi2,popcnt"

typedef struct { int count; int from[EXPAND_MOST_RUNS], to[EXPAND_MOST_RUNS]; uint32_t mask[EXPAND_MOST_RUNS]; } runs_t;

/* The runs of set bits of a deposit mask of at most 32 bits, lowest first:
 * run r takes the value's bits from from[r] (what the runs below took) to
 * to[r]. 0, or -1 where there are more than EXPAND_MOST_RUNS. */
static int mask_runs(uint64_t bits, runs_t *r) {
    r->count = 0;
    if (bits >> 32) return -1;
    int taken = 0;
    for (int b = 0; b < 32;) {
        if (!(bits >> b & 1)) { b++; continue; }
        int w = 0;
        while (b + w < 32 && (bits >> (b + w) & 1)) w++;
        if (r->count == EXPAND_MOST_RUNS) return -1;
        r->from[r->count] = taken;
        r->to[r->count] = b;
        r->mask[r->count] = w >= 32 ? 0xFFFFFFFFu : (1u << w) - 1;
        r->count++;
        taken += w;
        b += w;
    }
    return 0;
}

CPU_HAS(avx512f_usable, "avx512f")
CPU_HAS(avx512bw_usable, "avx512bw")
CPU_HAS(avx512vl_usable, "avx512vl")
CPU_HAS(avx512vbmi2_usable, "avx512vbmi2")

/* Whether the expand kernels run here: the 16-bit words' also need VBMI2. */
static int expand_usable(int words16) {
    return avx512f_usable() && avx512bw_usable() && avx512vl_usable() && pdep_usable()
           && (!words16 || avx512vbmi2_usable());
}

/* A field's runs as vectors of shifts and masks (32- or 16-bit lanes), made once a call. */
typedef struct { __m512i from[EXPAND_MOST_RUNS], to[EXPAND_MOST_RUNS], mask[EXPAND_MOST_RUNS]; } vruns_t;

__attribute__((target(T32))) static inline __attribute__((always_inline))
void vector_runs(const runs_t *r, int lanes16, vruns_t *v) {
    for (int j = 0; j < r->count; j++) {
        v->from[j] = lanes16 ? _mm512_set1_epi16((short)r->from[j]) : _mm512_set1_epi32(r->from[j]);
        v->to[j] = lanes16 ? _mm512_set1_epi16((short)r->to[j]) : _mm512_set1_epi32(r->to[j]);
        v->mask[j] = lanes16 ? _mm512_set1_epi16((short)r->mask[j]) : _mm512_set1_epi32((int)r->mask[j]);
    }
}

/* A field's value put into its runs' bits, in 32- or 16-bit lanes. */
__attribute__((target(T32))) static inline __attribute__((always_inline))
__m512i spread_runs(__m512i v, const vruns_t *r, int count, int lanes16) {
    __m512i out = _mm512_setzero_si512();
    for (int j = 0; j < count; j++) {
        __m512i t = lanes16 ? _mm512_srlv_epi16(v, r->from[j]) : _mm512_srlv_epi32(v, r->from[j]);
        t = _mm512_and_si512(t, r->mask[j]);
        out = _mm512_or_si512(out, lanes16 ? _mm512_sllv_epi16(t, r->to[j]) : _mm512_sllv_epi32(t, r->to[j]));
    }
    return out;
}

/* The one-element loop from element i on, for the blocks the vectors left:
 * the kernel's result (as the deposit kernels'). */
__attribute__((target("bmi2"))) static inline __attribute__((always_inline)) int expand_rest(
        const uint8_t *cls, Py_ssize_t i, Py_ssize_t n, const uint8_t **part, const uint8_t *const *end, Py_ssize_t k,
        int pbytes, const uint8_t *x, uint64_t rest_bits, uint64_t context_bits, void *dst, int dbytes) {
    for (; i < n; i++) {
        const uint8_t c = cls[i];
        if (c >= k || part[c] == end[c]) break;
        const uint64_t v = pbytes == 4 ? *(const u32u *)part[c] : pbytes == 2 ? *(const u16u *)part[c] : *part[c];
        part[c] += pbytes;
        const uint64_t w = _pdep_u64(v, rest_bits) | _pdep_u64(x[i], context_bits);
        if (dbytes == 4) ((u32u *)dst)[i] = (uint32_t)w;
        else ((u16u *)dst)[i] = (uint16_t)w;
    }
    int bad = i < n;
    for (Py_ssize_t j = 0; j < k; j++) bad |= part[j] != end[j];
    return bad;
}

/* Each part's first and past-the-end bytes (the expand kernels', AVX-512 and AVX2). */
static inline __attribute__((always_inline)) void part_bounds(const void **src, const Py_ssize_t *have, Py_ssize_t k,
                                                               int pbytes, const uint8_t **part, const uint8_t **end) {
    for (Py_ssize_t j = 0; j < k; j++) {
        part[j] = src[j];
        end[j] = part[j] + pbytes * have[j];
    }
}

/* A call's runs as vectors, and each part's bounds. */
__attribute__((target(T32))) static inline __attribute__((always_inline)) void expand_start(
        const runs_t *rr, const runs_t *rc, int lanes16, const void **src, const Py_ssize_t *have, Py_ssize_t k,
        int pbytes, vruns_t *vr, vruns_t *vc, const uint8_t **part, const uint8_t **end) {
    vector_runs(rr, lanes16, vr);
    vector_runs(rc, lanes16, vc);
    part_bounds(src, have, k, pbytes, part, end);
}

/* F32: 16 words a block, parts of 32 bits; nr and nc runs (inlined with
 * a float's counts, 2 and 1, as constants). */
__attribute__((target(T32))) static inline __attribute__((always_inline)) int expand32_body(
        const uint8_t *cls, Py_ssize_t n, const void **src, const Py_ssize_t *have, Py_ssize_t k, const uint8_t *x,
        uint64_t rest_bits, uint64_t context_bits, uint32_t *d, const runs_t *rr, const runs_t *rc, int nr, int nc) {
    vruns_t vr, vc;
    const uint8_t *part[EXPAND_MOST_CLASSES], *end[EXPAND_MOST_CLASSES];
    expand_start(rr, rc, 0, src, have, k, 4, &vr, &vc, part, end);
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m128i c = _mm_loadu_si128((const __m128i *)(cls + i));
        __m512i acc = _mm512_setzero_si512();
        unsigned seen = 0;
        Py_ssize_t j = 0;
#pragma GCC unroll 1
        for (; j < k; j++) {
            const __mmask16 m = _mm_cmpeq_epi8_mask(c, _mm_set1_epi8((char)j));
            const size_t bytes = 4 * (size_t)_mm_popcnt_u32(m);
            if (bytes > (size_t)(end[j] - part[j])) break;
            acc = _mm512_or_si512(acc, _mm512_maskz_expandloadu_epi32(m, part[j]));  /* reads those bytes only */
            part[j] += bytes;
            seen |= m;
        }
        if (j < k || seen != 0xFFFFu) {  /* undo this block's steps */
            while (j-- > 0) part[j] -= 4 * _mm_popcnt_u32(_mm_cmpeq_epi8_mask(c, _mm_set1_epi8((char)j)));
            break;
        }
        const __m512i xv = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(x + i)));
        _mm512_storeu_si512((void *)(d + i), _mm512_or_si512(spread_runs(acc, &vr, nr, 0), spread_runs(xv, &vc, nc, 0)));
    }
    return expand_rest(cls, i, n, part, end, k, 4, x, rest_bits, context_bits, d, 4);
}

/* F16 (parts of 16 bits) and BF16 (parts of 8), 32 words a block. */
__attribute__((target(T16))) static inline __attribute__((always_inline)) int expand16_body(
        const uint8_t *cls, Py_ssize_t n, const void **src, const Py_ssize_t *have, Py_ssize_t k, const uint8_t *x,
        uint64_t rest_bits, uint64_t context_bits, uint16_t *d, const runs_t *rr, const runs_t *rc, int nr, int nc,
        int pbytes) {
    vruns_t vr, vc;
    const uint8_t *part[EXPAND_MOST_CLASSES], *end[EXPAND_MOST_CLASSES];
    expand_start(rr, rc, 1, src, have, k, pbytes, &vr, &vc, part, end);
    Py_ssize_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m256i c = _mm256_loadu_si256((const __m256i *)(cls + i));
        __m512i acc = _mm512_setzero_si512();
        __m256i acc8 = _mm256_setzero_si256();
        unsigned seen = 0;
        Py_ssize_t j = 0;
#pragma GCC unroll 1
        for (; j < k; j++) {
            const __mmask32 m = _mm256_cmpeq_epi8_mask(c, _mm256_set1_epi8((char)j));
            const size_t bytes = pbytes * (size_t)_mm_popcnt_u32(m);
            if (bytes > (size_t)(end[j] - part[j])) break;
            if (pbytes == 1) acc8 = _mm256_or_si256(acc8, _mm256_maskz_expandloadu_epi8(m, part[j]));
            else acc = _mm512_or_si512(acc, _mm512_maskz_expandloadu_epi16(m, part[j]));
            part[j] += bytes;
            seen |= m;
        }
        if (j < k || seen != 0xFFFFFFFFu) {  /* undo this block's steps */
            while (j-- > 0) part[j] -= pbytes * _mm_popcnt_u32(_mm256_cmpeq_epi8_mask(c, _mm256_set1_epi8((char)j)));
            break;
        }
        if (pbytes == 1) acc = _mm512_cvtepu8_epi16(acc8);
        const __m512i xv = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(x + i)));
        _mm512_storeu_si512((void *)(d + i), _mm512_or_si512(spread_runs(acc, &vr, nr, 1), spread_runs(xv, &vc, nc, 1)));
    }
    return expand_rest(cls, i, n, part, end, k, pbytes, x, rest_bits, context_bits, d, 2);
}

__attribute__((target(T32)))
static int expand_32_8_32(const uint8_t *cls, Py_ssize_t n, const void **src, const Py_ssize_t *have, Py_ssize_t k,
                          const void *ctx, uint64_t rest_bits, uint64_t context_bits, void *dst,
                          const runs_t *rr, const runs_t *rc) {
    if (rr->count == 2 && rc->count == 1)
        return expand32_body(cls, n, src, have, k, ctx, rest_bits, context_bits, dst, rr, rc, 2, 1);
    return expand32_body(cls, n, src, have, k, ctx, rest_bits, context_bits, dst, rr, rc, rr->count, rc->count);
}

/* F16 (parts of pbytes = 2) and BF16 (pbytes = 1): each of the four
 * bodies inlined with its constants. */
__attribute__((target(T16)))
static int expand_16(const uint8_t *cls, Py_ssize_t n, const void **src, const Py_ssize_t *have, Py_ssize_t k,
                     const void *ctx, uint64_t rest_bits, uint64_t context_bits, void *dst,
                     const runs_t *rr, const runs_t *rc, int pbytes) {
    const int floats = rr->count == 2 && rc->count == 1;
    if (pbytes == 1)
        return floats ? expand16_body(cls, n, src, have, k, ctx, rest_bits, context_bits, dst, rr, rc, 2, 1, 1)
                      : expand16_body(cls, n, src, have, k, ctx, rest_bits, context_bits, dst, rr, rc, rr->count, rc->count, 1);
    return floats ? expand16_body(cls, n, src, have, k, ctx, rest_bits, context_bits, dst, rr, rc, 2, 1, 2)
                  : expand16_body(cls, n, src, have, k, ctx, rest_bits, context_bits, dst, rr, rc, rr->count, rc->count, 2);
}

/* Without AVX-512 (Zen 3, Haswell to Alder Lake), F32 words 8 at a time
 * with AVX2, for a few classes: each class, in every block (a branch on
 * whether it is there mispredicted: twice the time), loads its next eight
 * elements (near a part's end, as many as the block takes, with a mask:
 * no byte past them is read), moves them into its lanes by a permutation
 * from a table of the 256 lane masks (VPERMD), and the parts and the
 * context are spread into their ranges by shifts and masks. The deposit
 * loop keeps a pointer per class in memory, loaded and stored for every
 * element: piper's one-shot unpack (five classes) spent 28-30 ms a run in
 * it, 17-19 here. */
#define T8 "avx2,bmi2,popcnt"
#define EXPAND8_MOST_CLASSES 6  /* a block's steps grow with the classes (warm, 2^18 words): level with
                                 * the deposit loop at six (1.24 ns a word against 1.22), slower past it
                                 * (1.41 at seven, 1.69 at eight) */
static uint64_t expand8_order[256];  /* mask m: lane l's byte, how many of m's lanes lie below l */

static void expand8_tables(void) {
    for (int m = 0; m < 256; m++) {
        uint64_t order = 0;
        for (int l = 0, below = 0; l < 8; l++)
            if (m >> l & 1) order |= (uint64_t)(below++) << (8 * l);
        expand8_order[m] = order;
    }
}

typedef struct { __m256i from[EXPAND_MOST_RUNS], to[EXPAND_MOST_RUNS], mask[EXPAND_MOST_RUNS]; } vruns8_t;

__attribute__((target(T8))) static inline __attribute__((always_inline))
__m256i spread_runs8(__m256i v, const vruns8_t *r, int count) {
    __m256i out = _mm256_setzero_si256();
    for (int j = 0; j < count; j++)
        out = _mm256_or_si256(out, _mm256_sllv_epi32(_mm256_and_si256(_mm256_srlv_epi32(v, r->from[j]), r->mask[j]),
                                                     r->to[j]));
    return out;
}

/* K: the classes, a constant where the caller inlines one (the loop over
 * them unrolled, each class's pointer in a register), or 0: k of them. */
__attribute__((target(T8))) static inline __attribute__((always_inline)) int expand8_body(
        const uint8_t *cls, Py_ssize_t n, const void **src, const Py_ssize_t *have, Py_ssize_t k, const uint8_t *x,
        uint64_t rest_bits, uint64_t context_bits, uint32_t *d, const runs_t *rr, const runs_t *rc, int nr, int nc,
        const int K) {
    if (K) k = K;
    vruns8_t vr, vc;
    for (int j = 0; j < nr; j++) {
        vr.from[j] = _mm256_set1_epi32(rr->from[j]); vr.to[j] = _mm256_set1_epi32(rr->to[j]);
        vr.mask[j] = _mm256_set1_epi32((int)rr->mask[j]);
    }
    for (int j = 0; j < nc; j++) {
        vc.from[j] = _mm256_set1_epi32(rc->from[j]); vc.to[j] = _mm256_set1_epi32(rc->to[j]);
        vc.mask[j] = _mm256_set1_epi32((int)rc->mask[j]);
    }
    const uint8_t *part[EXPAND_MOST_CLASSES], *end[EXPAND_MOST_CLASSES];
    part_bounds(src, have, k, 4, part, end);
    /* first + 8 - c: the lanes below c set (a masked load of c elements,
     * for a part's last ones: no byte past them is read) */
    static const int32_t first[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i c = _mm_loadl_epi64((const __m128i *)(cls + i));
        __m256i acc = _mm256_setzero_si256();
        unsigned seen = 0;
        Py_ssize_t j = 0;
#pragma GCC unroll 16
        for (; j < k; j++) {
            const __m128i eq = _mm_cmpeq_epi8(c, _mm_set1_epi8((char)j));
            const unsigned m = (unsigned)_mm_movemask_epi8(eq) & 0xFFu;
            const unsigned count = (unsigned)_mm_popcnt_u32(m);
            const size_t left = (size_t)(end[j] - part[j]);
            __m256i loaded;
            if (left >= 32) loaded = _mm256_loadu_si256((const __m256i *)part[j]);
            else if (4 * (size_t)count > left) break;
            else loaded = _mm256_maskload_epi32((const int *)part[j], _mm256_loadu_si256((const __m256i *)(first + 8 - count)));
            const __m256i order = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)&expand8_order[m]));
            acc = _mm256_blendv_epi8(acc, _mm256_permutevar8x32_epi32(loaded, order), _mm256_cvtepi8_epi32(eq));
            part[j] += 4 * count;
            seen |= m;
        }
        if (j < k || seen != 0xFFu) {  /* undo this block's steps */
            while (j-- > 0) part[j] -= 4 * _mm_popcnt_u32((unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(c, _mm_set1_epi8((char)j))) & 0xFFu);
            break;
        }
        const __m256i xv = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(x + i)));
        _mm256_storeu_si256((__m256i *)(d + i), _mm256_or_si256(spread_runs8(acc, &vr, nr), spread_runs8(xv, &vc, nc)));
    }
    return expand_rest(cls, i, n, part, end, k, 4, x, rest_bits, context_bits, d, 4);
}

/* A float's runs (2 and 1) and one to six classes inlined as constants. */
__attribute__((target(T8)))
static int expand8_32_8_32(const uint8_t *cls, Py_ssize_t n, const void **src, const Py_ssize_t *have, Py_ssize_t k,
                           const void *ctx, uint64_t rest_bits, uint64_t context_bits, void *dst,
                           const runs_t *rr, const runs_t *rc) {
#define EXPAND8(K) return expand8_body(cls, n, src, have, k, ctx, rest_bits, context_bits, dst, rr, rc, 2, 1, K)
    if (rr->count == 2 && rc->count == 1)
        switch (k) {
        case 1: EXPAND8(1); case 2: EXPAND8(2); case 3: EXPAND8(3); case 4: EXPAND8(4); case 5: EXPAND8(5);
        case 6: EXPAND8(6); default: EXPAND8(0);
        }
#undef EXPAND8
    return expand8_body(cls, n, src, have, k, ctx, rest_bits, context_bits, dst, rr, rc, rr->count, rc->count, 0);
}

/* The kernel for these widths: 0 or 1 as the kernel's result, -1 where
 * there is none (the caller goes element by element). */
static int scatter_join_pdep(const uint8_t *cls, Py_ssize_t n, const void **src, const Py_ssize_t *have, Py_ssize_t k,
                             int psize, uint64_t rest_bits, const void *ctx, int xsize, uint64_t context_bits,
                             void *dst, int dsize, int simd) {
    runs_t rr, rc;
    if (simd && k <= EXPAND_MOST_CLASSES && xsize == 1 && mask_runs(rest_bits, &rr) == 0
        && mask_runs(context_bits, &rc) == 0) {
        if (psize == 4 && dsize == 4 && expand_usable(0))
            return expand_32_8_32(cls, n, src, have, k, ctx, rest_bits, context_bits, dst, &rr, &rc);
        if ((psize == 2 || psize == 1) && dsize == 2 && expand_usable(1))
            return expand_16(cls, n, src, have, k, ctx, rest_bits, context_bits, dst, &rr, &rc, psize);
        if (psize == 4 && dsize == 4 && k <= EXPAND8_MOST_CLASSES && avx2_usable() && pdep_usable())
            return expand8_32_8_32(cls, n, src, have, k, ctx, rest_bits, context_bits, dst, &rr, &rc);
    }
    if (psize == 4 && xsize == 1 && dsize == 4) return deposit_32_8_32(cls, n, src, have, k, ctx, rest_bits, context_bits, dst);
    if (psize == 1 && xsize == 1 && dsize == 2) return deposit_8_8_16(cls, n, src, have, k, ctx, rest_bits, context_bits, dst);
    if (psize == 2 && xsize == 1 && dsize == 2) return deposit_16_8_16(cls, n, src, have, k, ctx, rest_bits, context_bits, dst);
    if (psize == 8 && xsize == 2 && dsize == 8) return deposit_64_16_64(cls, n, src, have, k, ctx, rest_bits, context_bits, dst);
    return -1;
}

/* scatter_join(classes, parts, rest_ranges, context, context_ranges, dst) -> None
 * The whole inverse of `partition` after its children are read, in one
 * pass: word i of dst gets context[i] at context_ranges and the next
 * element of parts[classes[i]] at rest_ranges (as join does with each
 * field). scatter, then two joins, made three passes over the words and a
 * rest field of the output's size. classes: n bytes, each below len(parts) <=
 * 256; parts: buffers of items of one size (1, 2, 4 or 8 bytes), part j
 * holding exactly as many as classes holds j's, context: n items of 1, 2, 4 or
 * 8 bytes. */
static PyObject *layout_scatter_join(PyObject *self, PyObject *args) {
    PyObject *co, *po, *rro, *xo, *cro, *dobj;
    int simd = 1;
    if (!PyArg_ParseTuple(args, "OOOOOO|p", &co, &po, &rro, &xo, &cro, &dobj, &simd)) return NULL;
    PyObject *seq = PySequence_Fast(po, "parts must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
    if (k < 1 || k > 256) { Py_DECREF(seq); PyErr_SetString(PyExc_ValueError, "1 to 256 parts"); return NULL; }
    Py_buffer cb, xb, db, pb[256];
    Py_ssize_t held = 0, have[256] = {0}, used[256] = {0};  /* classes past the parts have none */
    const uint8_t *src[256];
    spread_t *sr = NULL, *sc = NULL;
    int ok = 0, stage = 0;
    if (PyObject_GetBuffer(co, &cb, PyBUF_C_CONTIGUOUS) < 0) goto release;
    stage = 1;
    if (PyObject_GetBuffer(xo, &xb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto release;
    stage = 2;
    if (PyObject_GetBuffer(dobj, &db, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0) goto release;
    stage = 3;
    const int dsize = (int)db.itemsize, xsize = (int)xb.itemsize;
    const Py_ssize_t n = cb.len;
    int psize = 0;
    for (; held < k; held++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, held), &pb[held], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto release;
        if (held == 0) psize = (int)pb[0].itemsize;
        src[held] = pb[held].buf;
        have[held] = pb[held].itemsize == psize ? pb[held].len / psize : -1;
    }
    if ((dsize != 1 && dsize != 2 && dsize != 4 && dsize != 8) || (xsize != 1 && xsize != 2 && xsize != 4 && xsize != 8)
        || (psize != 1 && psize != 2 && psize != 4 && psize != 8) || db.len != n * dsize || xb.len != n * xsize) {
        PyErr_SetString(PyExc_ValueError, "classes, context and dst must hold as many items (of 1, 2, 4 or 8 bytes)");
        goto release;
    }
    const uint8_t *cls = cb.buf;
    for (Py_ssize_t c = 0; c < k; c++)
        if (have[c] < 0 || pb[c].len != have[c] * psize) {
            PyErr_SetString(PyExc_ValueError, "the parts must hold whole items of one size");
            goto release;
        }
    sr = PyMem_Malloc(sizeof(spread_t));
    sc = PyMem_Malloc(sizeof(spread_t));
    if (!sr || !sc) { PyErr_NoMemory(); goto release; }
    if (parse_ranges(rro, 8 * dsize, 8 * psize, sr) < 0 || parse_ranges(cro, 8 * dsize, 8 * xsize, sc) < 0) goto release;
    const void *ctx = xb.buf;
    void *dst = db.buf;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    /* A deposit kernel where the ranges allow one and the widths have one; else element by element. */
    if (pdep_usable() && sr->deposit && sc->deposit
        && (bad = scatter_join_pdep(cls, n, (const void **)src, have, k, psize, sr->bits, ctx, xsize, sc->bits, dst, dsize, simd)) >= 0) {
        /* done in one of the float widths' kernels */
    } else {
        Py_ssize_t i = 0;
        for (; i < n; i++) {
            uint8_t c = cls[i];
            if (used[c] >= have[c]) break;
            store_item(dst, dsize, i, spread(sr, load_item(src[c], psize, used[c]++)) | spread(sc, load_item(ctx, xsize, i)));
        }
        bad = i < n;
        for (Py_ssize_t j = 0; j < k; j++) bad |= used[j] != have[j];
    }
    Py_END_ALLOW_THREADS
    if (bad) { PyErr_SetString(PyExc_ValueError, "the parts do not hold the classes' elements"); goto release; }
    ok = 1;
release:
    PyMem_Free(sr);
    PyMem_Free(sc);
    for (Py_ssize_t j = 0; j < held; j++) PyBuffer_Release(&pb[j]);
    if (stage >= 3) PyBuffer_Release(&db);
    if (stage >= 2) PyBuffer_Release(&xb);
    if (stage >= 1) PyBuffer_Release(&cb);
    Py_DECREF(seq);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* The three buffers of a call that reads a byte array and a typed one and
 * writes a typed one (lookup, patch): 0, or -1 with none held. */
static int take_three(PyObject *bytes, PyObject *typed, PyObject *dst, Py_buffer *bb, Py_buffer *tb, Py_buffer *db) {
    if (PyObject_GetBuffer(bytes, bb, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (PyObject_GetBuffer(typed, tb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) { PyBuffer_Release(bb); return -1; }
    if (PyObject_GetBuffer(dst, db, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(bb); PyBuffer_Release(tb);
        return -1;
    }
    return 0;
}

/* lookup(ranks, table, dst) -> escaped
 * dst[i] = table[ranks[i]] (ranks: bytes; table and dst: items of one size,
 * 1, 2, 4 or 8 bytes) and how many ranks equal len(table) - 1, the escape
 * (`rank`'s inverse before its exceptions are put in: patch). A rank past
 * the table is a ValueError. numpy's take widened every rank to intp. */
static PyObject *layout_lookup(PyObject *self, PyObject *args) {
    PyObject *ro, *to, *dobj;
    if (!PyArg_ParseTuple(args, "OOO", &ro, &to, &dobj)) return NULL;
    Py_buffer rb, tb, db;
    if (take_three(ro, to, dobj, &rb, &tb, &db) < 0) return NULL;
    const int size = (int)db.itemsize;
    const Py_ssize_t n = rb.len, entries = tb.itemsize ? tb.len / tb.itemsize : 0;
    Py_ssize_t escaped = 0;
    const char *error = NULL;
    if ((size != 1 && size != 2 && size != 4 && size != 8) || tb.itemsize != size || db.len != n * size)
        error = "table and dst must hold items of one size (1, 2, 4 or 8 bytes), dst one per rank";
    else if (entries < 1 || entries > 256)
        error = "the table holds 1 to 256 entries";
    else {
        const uint8_t *ranks = rb.buf;
        const Py_ssize_t top = entries - 1;
        int bad = 0;
        Py_BEGIN_ALLOW_THREADS
        uint64_t table[256] = {0};  /* ranks past the table read zeros there, then are refused */
        for (Py_ssize_t j = 0; j < entries; j++) table[j] = load_item(tb.buf, size, j);
        if (size == 1 && entries <= 16 && avx2_usable()) {  /* ranks of four bits or fewer: a byte shuffle */
            uint8_t table16[16], most;
            for (int j = 0; j < 16; j++) table16[j] = (uint8_t)table[j];  /* zeros past the entries */
            escaped = lookup16_avx2(ranks, n, table16, (uint8_t)top, db.buf, &most);
            bad = most > top;
        } else {
#define LOOKUP(T) { T *d = db.buf; for (Py_ssize_t i = 0; i < n; i++) { \
            uint8_t r = ranks[i]; bad |= r > top; escaped += r == top; d[i] = (T)table[r]; } }
            if (size == 1) LOOKUP(uint8_t) else if (size == 2) LOOKUP(u16u) else if (size == 4) LOOKUP(u32u) else LOOKUP(u64u)
#undef LOOKUP
        }
        Py_END_ALLOW_THREADS
        if (bad) error = "a rank lies past the table";
    }
    PyBuffer_Release(&rb); PyBuffer_Release(&tb); PyBuffer_Release(&db);
    if (error) { PyErr_SetString(PyExc_ValueError, error); return NULL; }
    return PyLong_FromSsize_t(escaped);
}

/* patch(ranks, escape, values, dst) -> None
 * dst[i] = the next of values wherever ranks[i] == escape (values and dst:
 * items of one size), values holding exactly one per such rank; without
 * the GIL (it held it for a pass over every rank: 2.8 ms of piper's). */
static PyObject *layout_patch(PyObject *self, PyObject *args) {
    PyObject *ro, *vo, *dobj;
    int escape;
    if (!PyArg_ParseTuple(args, "OiOO", &ro, &escape, &vo, &dobj)) return NULL;
    Py_buffer rb, vb, db;
    if (take_three(ro, vo, dobj, &rb, &vb, &db) < 0) return NULL;
    const int size = (int)db.itemsize;
    const Py_ssize_t n = rb.len;
    const char *error = NULL;
    if ((size != 1 && size != 2 && size != 4 && size != 8) || vb.itemsize != size || db.len != n * size)
        error = "values and dst must hold items of one size (1, 2, 4 or 8 bytes), dst one per rank";
    else if (escape < 0 || escape > 255) {  /* no byte equals it: no rank escapes */
        if (vb.len) error = "values must hold one item per escaped rank";
    } else {
        const uint8_t *ranks = rb.buf, *end = ranks + n;
        Py_ssize_t have = vb.len / size, j = 0;
        Py_BEGIN_ALLOW_THREADS
        /* Escapes are rare: memchr skips the runs between them a vector at a time. */
        for (const uint8_t *at = ranks; j <= have && (at = memchr(at, escape, (size_t)(end - at))) != NULL; at++, j++)
            if (j < have) store_item(db.buf, size, at - ranks, load_item(vb.buf, size, j));
        Py_END_ALLOW_THREADS
        if (j != have) error = "values must hold one item per escaped rank";
    }
    PyBuffer_Release(&rb); PyBuffer_Release(&vb); PyBuffer_Release(&db);
    if (error) { PyErr_SetString(PyExc_ValueError, error); return NULL; }
    Py_RETURN_NONE;
}

/* unpack(packed, bits, dst) -> None
 * dst[i] = lane i % (8 / bits) of packed byte i / (8 / bits), lanes from
 * the low bits up (bits 1, 2 or 4): the inverse of pack_bits. packed must
 * hold exactly the bytes dst's count needs. */
static PyObject *layout_unpack(PyObject *self, PyObject *args) {
    PyObject *po, *dobj;
    int bits;
    if (!PyArg_ParseTuple(args, "OiO", &po, &bits, &dobj)) return NULL;
    if (bits != 1 && bits != 2 && bits != 4) { PyErr_SetString(PyExc_ValueError, "bits must be 1, 2 or 4"); return NULL; }
    Py_buffer pb, db;
    if (PyObject_GetBuffer(po, &pb, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(dobj, &db, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) { PyBuffer_Release(&pb); return NULL; }
    const int per = 8 / bits;
    const Py_ssize_t n = db.len;
    int ok = pb.len == (n + per - 1) / per;
    if (ok) {
        const uint8_t *p = pb.buf, mask = (uint8_t)((1 << bits) - 1);
        uint8_t *d = db.buf;
        const Py_ssize_t whole = n / per;
        Py_BEGIN_ALLOW_THREADS
        Py_ssize_t b = bits == 4 && avx2_usable() ? unpack4_avx2(p, whole, d) : 0;
        for (; b < whole; b++) {
            uint8_t v = p[b];
            for (int l = 0; l < per; l++) d[b * per + l] = (uint8_t)((v >> (l * bits)) & mask);
        }
        for (Py_ssize_t i = whole * per; i < n; i++) d[i] = (uint8_t)((p[i / per] >> ((i % per) * bits)) & mask);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&pb); PyBuffer_Release(&db);
    if (!ok) { PyErr_SetString(PyExc_ValueError, "packed must hold the bytes of len(dst) lanes"); return NULL; }
    Py_RETURN_NONE;
}

/* interleave(planes, dst) -> None
 * Byte j of dst's item i = planes[j][i], bytes past the planes zero: the
 * inverse of byte_planes. planes: 1 to itemsize byte buffers of n bytes
 * each; dst: n items of 1, 2, 4 or 8 bytes. One write a word; numpy
 * zeroed the words, then copied each plane with a stride. */
static PyObject *layout_interleave(PyObject *self, PyObject *args) {
    PyObject *po, *dobj;
    if (!PyArg_ParseTuple(args, "OO", &po, &dobj)) return NULL;
    PyObject *seq = PySequence_Fast(po, "planes must be a sequence");
    if (!seq) return NULL;
    Py_buffer db, pb[8];
    const uint8_t *pl[8];
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq), held = 0;
    int ok = 0;
    if (PyObject_GetBuffer(dobj, &db, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0) { Py_DECREF(seq); return NULL; }
    const int size = (int)db.itemsize;
    const Py_ssize_t n = (size == 1 || size == 2 || size == 4 || size == 8) ? db.len / size : -1;
    if (n < 0 || k < 1 || k > size) { PyErr_SetString(PyExc_ValueError, "1 to itemsize planes, dst of 1, 2, 4 or 8-byte items"); goto release; }
    for (; held < k; held++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, held), &pb[held], PyBUF_C_CONTIGUOUS) < 0) goto release;
        pl[held] = pb[held].buf;
        if (pb[held].len != n) { held++; PyErr_SetString(PyExc_ValueError, "every plane holds one byte per item of dst"); goto release; }
    }
    Py_BEGIN_ALLOW_THREADS
    uint8_t *d = db.buf;
#define WEAVE(T) { T *w = (T *)d; for (Py_ssize_t i = 0; i < n; i++) { T v = 0; \
        for (int j = 0; j < k; j++) { v |= (T)pl[j][i] << (8 * j); } w[i] = v; } }
    if (k == 3 && size == 4) {  /* 24-bit fields: unrolled, the compiler vectorizes it */
        const uint8_t *a = pl[0], *b = pl[1], *c = pl[2];
        u32u *w = (u32u *)d;
        for (Py_ssize_t i = 0; i < n; i++) w[i] = (uint32_t)a[i] | (uint32_t)b[i] << 8 | (uint32_t)c[i] << 16;
    } else if (k == 2 && size == 2) {
        const uint8_t *a = pl[0], *b = pl[1];
        u16u *w = (u16u *)d;
        for (Py_ssize_t i = 0; i < n; i++) w[i] = (uint16_t)(a[i] | b[i] << 8);
    } else if (size == 1) WEAVE(uint8_t) else if (size == 2) WEAVE(u16u) else if (size == 4) WEAVE(u32u) else WEAVE(u64u)
#undef WEAVE
    Py_END_ALLOW_THREADS
    ok = 1;
release:
    for (Py_ssize_t j = 0; j < held; j++) PyBuffer_Release(&pb[j]);
    PyBuffer_Release(&db);
    Py_DECREF(seq);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* prefix(values, stride, xor) -> None
 * In place, lane by lane: values[i] += values[i - stride] (modulo the
 * items' width), or ^= where xor, for i from stride on: the inverse of
 * delta and xor_delta (items of 1, 2, 4 or 8 bytes). numpy's accumulate
 * and cumsum took 1.9 ns a byte; one step a cycle here, the running value
 * kept in a register where the stride is 1. */
#define PREFIX(T) { \
        T *v = vb.buf; \
        if (stride == 1) { \
            T acc = v[0]; \
            if (xor) for (Py_ssize_t i = 1; i < n; i++) { acc ^= v[i]; v[i] = acc; } \
            else for (Py_ssize_t i = 1; i < n; i++) { acc = (T)(acc + v[i]); v[i] = acc; } \
        } else if (xor) for (Py_ssize_t i = stride; i < n; i++) v[i] ^= v[i - stride]; \
        else for (Py_ssize_t i = stride; i < n; i++) v[i] = (T)(v[i] + v[i - stride]); }
static PyObject *layout_prefix(PyObject *self, PyObject *args) {
    PyObject *vo;
    Py_ssize_t stride;
    int xor;
    if (!PyArg_ParseTuple(args, "Onp", &vo, &stride, &xor)) return NULL;
    Py_buffer vb;
    if (PyObject_GetBuffer(vo, &vb, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0) return NULL;
    const int size = (int)vb.itemsize;
    const Py_ssize_t n = (size == 1 || size == 2 || size == 4 || size == 8) ? vb.len / size : -1;
    if (n < 0 || stride < 1) {
        PyBuffer_Release(&vb);
        PyErr_SetString(PyExc_ValueError, "values of 1, 2, 4 or 8-byte items and a stride of at least 1");
        return NULL;
    }
    if (n > stride) {
        Py_BEGIN_ALLOW_THREADS
        if (size == 1) PREFIX(uint8_t) else if (size == 2) PREFIX(u16u) else if (size == 4) PREFIX(u32u) else PREFIX(u64u)
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&vb);
    Py_RETURN_NONE;
}
#undef PREFIX

/* unzigzag(values) -> None
 * zigzag's inverse in place, in the values' width (1, 2, 4 or 8 bytes):
 * z -> (z >> 1) xor -(z & 1), one pass, where numpy took four (and, on a
 * fresh process's first chunk, 0.25 ms to set up its four ufunc loops). */
#define UNZIGZAG(T) { T *v = vb.buf; \
        for (Py_ssize_t i = 0; i < n; i++) { T z = v[i]; v[i] = (T)((T)(z >> 1) ^ (T)((T)0 - (T)(z & 1))); } }
static PyObject *layout_unzigzag(PyObject *self, PyObject *args) {
    PyObject *vo;
    if (!PyArg_ParseTuple(args, "O", &vo)) return NULL;
    Py_buffer vb;
    if (PyObject_GetBuffer(vo, &vb, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0) return NULL;
    const int size = (int)vb.itemsize;
    const Py_ssize_t n = (size == 1 || size == 2 || size == 4 || size == 8) ? vb.len / size : -1;
    if (n < 0) {
        PyBuffer_Release(&vb);
        PyErr_SetString(PyExc_ValueError, "values of 1, 2, 4 or 8-byte items");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    if (size == 1) UNZIGZAG(uint8_t) else if (size == 2) UNZIGZAG(u16u) else if (size == 4) UNZIGZAG(u32u) else UNZIGZAG(u64u)
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&vb);
    Py_RETURN_NONE;
}
#undef UNZIGZAG

/* scatter(src, pieces, dst) -> None
 * dst[at:at + n] = src[within:within + n] for each (at, within, n) of
 * pieces, every range checked against its buffer first: a gathered
 * segment's chunk put in its places in the file at once (a memoryview
 * assignment a piece, in Python, cost about 1 us each: taesd's 339,
 * ppocr's 694 in an unpack). */
static PyObject *layout_scatter(PyObject *self, PyObject *args) {
    PyObject *so, *po, *dobj;
    if (!PyArg_ParseTuple(args, "OOO", &so, &po, &dobj)) return NULL;
    PyObject *seq = PySequence_Fast(po, "pieces must be a sequence of (at, within, n)");
    if (!seq) return NULL;
    Py_buffer sb, db;
    if (PyObject_GetBuffer(so, &sb, PyBUF_C_CONTIGUOUS) < 0) { Py_DECREF(seq); return NULL; }
    if (PyObject_GetBuffer(dobj, &db, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&sb); Py_DECREF(seq); return NULL;
    }
    const Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    const char *error = NULL;
    for (int pass = 0; pass < 2 && !error; pass++)  /* every piece checked, then every piece copied */
        for (Py_ssize_t j = 0; j < count; j++) {
            Py_ssize_t at, within, n;
            PyObject *item = PySequence_Fast_GET_ITEM(seq, j);
            if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3) { error = "a piece is (at, within, n)"; break; }
            at = PyNumber_AsSsize_t(PyTuple_GET_ITEM(item, 0), PyExc_OverflowError);
            within = PyNumber_AsSsize_t(PyTuple_GET_ITEM(item, 1), PyExc_OverflowError);
            n = PyNumber_AsSsize_t(PyTuple_GET_ITEM(item, 2), PyExc_OverflowError);
            if ((at == -1 || within == -1 || n == -1) && PyErr_Occurred()) { error = ""; break; }
            if (at < 0 || within < 0 || n < 0 || n > sb.len - within || n > db.len - at) {
                error = "a piece lies outside its buffers";
                break;
            }
            if (pass) memcpy((uint8_t *)db.buf + at, (const uint8_t *)sb.buf + within, (size_t)n);
        }
    PyBuffer_Release(&sb);
    PyBuffer_Release(&db);
    Py_DECREF(seq);
    if (error) {
        if (*error) PyErr_SetString(PyExc_ValueError, error);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* skip_strings(buffer, offset, count) -> (offset, skipped): from `offset`
 * in the buffer, strings of a little-endian u64 length and that many
 * bytes, skipped while a length lies whole in the buffer, `count` at
 * most: where the walk got to (past the buffer's end where the last
 * string's bytes run past it, past 2^64 where its length does) and how
 * many it skipped. A GGUF vocabulary holds hundreds of thousands
 * (gemma3: 262,144): 25 ms a file in Python, one unpack and one add each,
 * 0.5 here (the AMD EPYC). */
static PyObject *layout_skip_strings(PyObject *self, PyObject *args) {
    Py_buffer b;
    Py_ssize_t start;
    unsigned long long count;
    if (!PyArg_ParseTuple(args, "y*nK", &b, &start, &count)) return NULL;
    if (start < 0) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "skip_strings: a negative offset");
        return NULL;
    }
    const uint8_t *buf = b.buf;
    uint64_t len = (uint64_t)b.len, off = (uint64_t)start, done = 0, n = 0;
    int past = 0;  /* the last length took the walk past 2^64: its end is off + 8 + n */
    for (; done < count && off <= len && len - off >= 8; done++) {
        memcpy(&n, buf + off, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        n = __builtin_bswap64(n);
#endif
        if (n > UINT64_MAX - 8 - off) { past = 1; done++; break; }
        off += 8 + n;
    }
    PyBuffer_Release(&b);
    if (!past) return Py_BuildValue("KK", (unsigned long long)off, (unsigned long long)done);
    /* off + n + 8 as Python's integers add them */
    PyObject *a = PyLong_FromUnsignedLongLong(off), *c = PyLong_FromUnsignedLongLong(n), *eight = PyLong_FromLong(8);
    PyObject *sum = a && c ? PyNumber_Add(a, c) : NULL, *end = sum && eight ? PyNumber_Add(sum, eight) : NULL;
    Py_XDECREF(a); Py_XDECREF(c); Py_XDECREF(eight); Py_XDECREF(sum);
    if (!end) return NULL;
    return Py_BuildValue("NK", end, (unsigned long long)done);
}

/* keep_freed(mmap_threshold, trim_threshold) -> bool: glibc's mallopt
 * M_MMAP_THRESHOLD and M_TRIM_THRESHOLD (heap.keep_freed_memory); False
 * where the C library is not glibc or refuses a value. */
static PyObject *layout_keep_freed(PyObject *self, PyObject *args) {
    int mmap_threshold, trim_threshold;
    if (!PyArg_ParseTuple(args, "ii", &mmap_threshold, &trim_threshold)) return NULL;
#ifdef __GLIBC__
    return PyBool_FromLong(mallopt(M_MMAP_THRESHOLD, mmap_threshold) && mallopt(M_TRIM_THRESHOLD, trim_threshold));
#else
    Py_RETURN_FALSE;
#endif
}

/* prefault(buffers, stop, slow_ns, every_ns, wake=-1) -> (bytes, switched): the
 * buffers' pages faulted in (on x86-64 by a write that changes nothing,
 * elsewhere madvise MADV_POPULATE_WRITE: their bytes unchanged either
 * way), a huge page's span (2 MiB, aligned) at a time, the GIL
 * released throughout, in two phases told by stop[0]:
 * 0: in order, each buffer front to back (where the writes will begin);
 * 1: the writes under way, a sample: one span every every_ns, from the
 *    last buffer's end backwards (where they will end), down to the front
 *    of phase 0;
 * anything else: the call ends (after the span under way; a sleep between
 * samples ends at once where `wake`, an eventfd, is written to).
 * Two spans in a row, of those phase 0 faults or phase 1 samples, whose
 * faults cost this thread more than slow_ns of CPU time each (huge pages
 * the kernel is slow to give: on these virtual machines, memory the host
 * has not backed yet, about 4.8 ms a span against 0.22 where it has) turn
 * huge pages off (MADV_NOHUGEPAGE) for everything not yet faulted, and
 * end the call: the rest comes in base pages, faulted by the writes. Only
 * whole spans are judged (a buffer's unaligned head and tail are base
 * pages anyway, and the first faults also build page tables). bytes:
 * those populated; switched: whether huge pages were turned off. Ends at
 * madvise's first refusal (a kernel before 5.14: EINVAL), leaving the
 * rest to the writes' faults. */
#define HUGE_SPAN ((uintptr_t)2 << 20)
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  /* Linux's, from 5.14 (older headers lack it) */
#endif

#ifdef __linux__
typedef struct { Py_buffer *bufs; Py_ssize_t k; uintptr_t page; long long slow_ns, done; int slow; } prefault_t;

/* Fault [at, at + n) in: 0, 1 where the call is to end (refused, or huge
 * pages just turned off for what lies from buffer j's `from` on). */
static int prefault_span(prefault_t *p, uintptr_t at, uintptr_t n, Py_ssize_t j, uintptr_t from) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    /* A locked OR of 0 into a byte of each page: a write fault that
     * changes nothing, atomically against the decoding threads' own
     * writes (phase 1 runs beside them). A fault takes only its mapping's
     * lock, where MADV_POPULATE_WRITE holds the process's memory map for
     * the call: a huge page the host is slow to give (4.8 ms) stalled
     * every mmap and munmap of the other threads meanwhile (the main
     * thread's, reading the index). benchmarks/map_lock.py, 512 MiB
     * faulted in beside a loop of mmap calls, four rounds: p99 0.58-9.23
     * ms, longest 3.41-12.60, against 0.09-0.12 and 0.59-4.28 here. */
    for (uintptr_t a = at; a < at + n; a += p->page) __asm__ volatile("lock orb $0, (%0)" : : "r"(a) : "memory");
#else
    if (madvise((void *)at, n, MADV_POPULATE_WRITE)) return 1;
#endif
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    p->done += (long long)n;
    if (n != HUGE_SPAN) return 0;
    long long ns = (t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
    p->slow = ns > p->slow_ns ? p->slow + 1 : 0;
    if (p->slow < 2) return 0;
    for (Py_ssize_t i = j; i < p->k; i++) {  /* the rest of buffer j, and every later one */
        uintptr_t a = i == j ? from : (uintptr_t)p->bufs[i].buf, e = (uintptr_t)p->bufs[i].buf + (uintptr_t)p->bufs[i].len;
        a -= a % p->page;
        if (e > a) madvise((void *)a, e - a, MADV_NOHUGEPAGE);
    }
    p->slow = -1;  /* switched */
    return 1;
}
#endif

static PyObject *layout_prefault(PyObject *self, PyObject *args) {
    PyObject *bo, *so;
    long long slow_ns, every_ns;
    int wake = -1;
    if (!PyArg_ParseTuple(args, "OOLL|i", &bo, &so, &slow_ns, &every_ns, &wake)) return NULL;
    PyObject *seq = PySequence_Fast(bo, "buffers must be a sequence");
    if (!seq) return NULL;
    const Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
    Py_buffer sb, *bufs = PyMem_Calloc(k ? (size_t)k : 1, sizeof(Py_buffer));
    Py_ssize_t held = 0;
    int stop_held = 0, switched = 0;
    long long done = 0;
    PyObject *result = NULL;
    if (!bufs) { PyErr_NoMemory(); goto release; }
    if (PyObject_GetBuffer(so, &sb, PyBUF_WRITABLE) < 0) goto release;
    stop_held = 1;
    if (sb.len < 1) { PyErr_SetString(PyExc_ValueError, "stop must hold a byte"); goto release; }
    if (every_ns < 1) { PyErr_SetString(PyExc_ValueError, "every_ns must be >= 1"); goto release; }
    for (; held < k; held++)
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, held), &bufs[held], PyBUF_WRITABLE) < 0) goto release;
#ifdef __linux__
    Py_BEGIN_ALLOW_THREADS
    prefault_t p = {bufs, k, (uintptr_t)sysconf(_SC_PAGESIZE), slow_ns, 0, 0};
    volatile const char *stop = sb.buf;
    Py_ssize_t j = 0;  /* phase 0's front: buffer j from `at` on */
    uintptr_t at = k ? (uintptr_t)bufs[0].buf - (uintptr_t)bufs[0].buf % p.page : 0;
    int ended = 0;
    while (j < k && !ended) {
        uintptr_t end = (uintptr_t)bufs[j].buf + (uintptr_t)bufs[j].len;
        if (at >= end) {
            if (++j < k) at = (uintptr_t)bufs[j].buf - (uintptr_t)bufs[j].buf % p.page;
            continue;
        }
        if (*stop) break;
        uintptr_t n = HUGE_SPAN - at % HUGE_SPAN;
        if (n > end - at) n = end - at;
        ended = prefault_span(&p, at, n, j, at + n);
        at += n;
    }
    /* phase 1: whole spans below `back` in buffer jb, down to the front */
    Py_ssize_t jb = k - 1;
    uintptr_t back = k ? (uintptr_t)bufs[k - 1].buf + (uintptr_t)bufs[k - 1].len : 0;
    while (!ended && j < k && *stop == 1) {
        struct timespec wait = {(time_t)(every_ns / 1000000000LL), (long)(every_ns % 1000000000LL)};
        if (wake >= 0) {  /* woken early by a write to `wake` (an eventfd): the call is to end */
            struct pollfd fd = {wake, POLLIN, 0};
            if (ppoll(&fd, 1, &wait, NULL) != 0) break;
        } else
            nanosleep(&wait, NULL);
        if (*stop != 1) break;
        uintptr_t span = back - back % HUGE_SPAN;  /* the whole span ending at or below back */
        uintptr_t low = jb == j ? at : (uintptr_t)bufs[jb].buf;
        while (span < low + HUGE_SPAN) {  /* no whole span left in buffer jb: the one before */
            if (--jb < j) break;
            back = (uintptr_t)bufs[jb].buf + (uintptr_t)bufs[jb].len;
            span = back - back % HUGE_SPAN;
            low = jb == j ? at : (uintptr_t)bufs[jb].buf;
        }
        if (jb < j) break;  /* met the front */
        back = span - HUGE_SPAN;
        ended = prefault_span(&p, back, HUGE_SPAN, j, at);
    }
    done = p.done;
    switched = p.slow < 0;
    Py_END_ALLOW_THREADS
#endif
    result = Py_BuildValue("(LO)", done, switched ? Py_True : Py_False);
release:
    for (Py_ssize_t j = 0; j < held; j++) PyBuffer_Release(&bufs[j]);
    if (stop_held) PyBuffer_Release(&sb);
    PyMem_Free(bufs);
    Py_DECREF(seq);
    return result;
}
#undef HUGE_SPAN

static PyMethodDef methods[] = {
    {"transpose", layout_transpose, METH_VARARGS, "transpose(src, rows, cols, itemsize, dst) -> None"},
    {"weave", layout_weave, METH_VARARGS, "weave(parts, widths, dst) -> None: every field of dst's records from its part"},
    {"unweave", layout_unweave, METH_VARARGS, "unweave(src, widths, parts) -> None: each part gets its field of src's records"},
    {"join", layout_join, METH_VARARGS, "join(src, ranges, dst, first) -> None"},
    {"classify", layout_classify, METH_VARARGS, "classify(context, table, classes) -> counts of the 256 classes"},
    {"split_classes", layout_split_classes, METH_VARARGS, "split_classes(classes, src, parts) -> None: parts[c] = src[classes == c]"},
    {"scatter_join", layout_scatter_join, METH_VARARGS, "scatter_join(classes, parts, rest_ranges, context, context_ranges, dst) -> None"},
    {"lookup", layout_lookup, METH_VARARGS, "lookup(ranks, table, dst) -> how many ranks escape"},
    {"patch", layout_patch, METH_VARARGS, "patch(ranks, escape, values, dst) -> None"},
    {"unpack", layout_unpack, METH_VARARGS, "unpack(packed, bits, dst) -> None"},
    {"prefix", layout_prefix, METH_VARARGS, "prefix(values, stride, xor) -> None: running sums or xors, in place"},
    {"interleave", layout_interleave, METH_VARARGS, "interleave(planes, dst) -> None"},
    {"unzigzag", layout_unzigzag, METH_VARARGS, "unzigzag(values) -> None: zigzag's inverse, in place"},
    {"scatter", layout_scatter, METH_VARARGS, "scatter(src, pieces, dst) -> None: dst[at:at + n] = src[within:within + n] for each (at, within, n)"},
    {"skip_strings", layout_skip_strings, METH_VARARGS, "skip_strings(buffer, offset, count) -> (offset, skipped): length-prefixed strings walked"},
    {"keep_freed", layout_keep_freed, METH_VARARGS, "keep_freed(mmap_threshold, trim_threshold) -> whether glibc's malloc took them"},
    {"prefault", layout_prefault, METH_VARARGS, "prefault(buffers, stop, slow_ns, every_ns, wake=-1) -> (bytes, switched): pages faulted in, huge ones turned off where slow"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_layout", "Layout kernels: the inverses of the layout operators, one pass each.", -1, methods};

PyMODINIT_FUNC PyInit__layout(void) {
    expand8_tables();
    return PyModule_Create(&module);
}
