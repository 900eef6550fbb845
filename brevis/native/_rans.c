/* Binned interleaved rANS: the hot loops of the `ans` coder (brevis/dsl/entropy.py).
 *
 * A value is coded as its bin (rANS, four 32-bit states taking the values in
 * turn, value i in state i % 4, renormalized by 16-bit words; 32 states in a
 * wide block, decoded eight at a time with AVX2 where the CPU has it) and its offset
 * in the bin (the value's low obits[bin] bits, in a separate little-endian
 * bit stream). The model (bins, frequencies summing to 2^P, P <= 16) is
 * chosen, written and read here as entropy.py's Python does it, to the bit
 * (encode_block writes a block, decode_stream reads a whole stream); the
 * Python serves a tree without the extension, and the tests hold the two
 * to the same bytes. The encoder runs backwards and writes words towards
 * the front of its buffer; the decoder reads the four final states, then
 * the words front to back. A decoder that would read past either stream,
 * or does not end on the encoder's initial states with every word and
 * every whole byte of offsets consumed, reports a damaged stream. Where
 * the CPU has AVX2, the narrow blocks of a decode call decode eight at a
 * time (multi_t, below).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "common.h"  /* u16u, u32u: values stored at any alignment; CPU_HAS */
/* xxHash (vendored, BSD 2-clause: xxhash/LICENSE), inlined: the checks that
 * decode_streams makes without the GIL, each stream's before it decodes and
 * each chunk's digest while its bytes are still in cache (format versions
 * 3 on: a stream's check; 7 on: a chunk's digest, XXH3-128). */
#define XXH_INLINE_ALL
#define XXH_STATIC_LINKING_ONLY
#include "xxhash/xxhash.h"
#ifdef BREVIS_XXH_DISPATCH  /* x86-64: AVX2 or AVX-512 where the CPU has them (xxh_x86dispatch.c) */
#include "xxhash/xxh_x86dispatch.h"
#endif

#define LANES 4
#define WIDE_LANES 32  /* a wide block's states (entropy.py WIDE_LANES) */
#define WIDE_FLAG 0x80  /* in a stream's first byte: its blocks are wide */
#define MAX_LANES WIDE_LANES
#define RANS_L (1u << 16)
#define MIN_BLOCK_LOG 10  /* the block sizes a reader accepts: entropy.py */
#define MAX_BLOCK_LOG 24

typedef struct { Py_buffer v; int held; } buf_t;

static int take(PyObject *obj, buf_t *b, int writable, const char *what) {
    if (PyObject_GetBuffer(obj, &b->v, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Format(PyExc_TypeError, "%s: a contiguous%s buffer is required", what, writable ? " writable" : "");
        return -1;
    }
    b->held = 1;
    return 0;
}

static void release(buf_t *bufs, int count) {
    for (int i = 0; i < count; i++) if (bufs[i].held) PyBuffer_Release(&bufs[i].v);
}

static inline uint32_t load(const void *p, int width, Py_ssize_t i) {
    return width == 1 ? ((const uint8_t *)p)[i] : width == 2 ? ((const uint16_t *)p)[i] : ((const uint32_t *)p)[i];
}

/* The rANS coding of n values into e (words: 2n + 2, offs: 4n + 8 bytes,
 * sym: bins entries, ranks: n entries, all the caller's): the final
 * states, the words (e->words[first..first + nwords), in decoding order) and the
 * offset bytes. A value's bin is rank_of[value >> shift], below `bins` for
 * every key (encode_block's table: the block's bins, 0 at every other key;
 * not checked here, a value at a time). 0, or -1 where a value lies
 * outside its bin or a bin has no frequency. Needs no GIL. */
typedef struct { uint64_t x_max; uint32_t m, l, freq, cum; } sym_t;  /* a bin, as the coding step needs it */
typedef struct { uint16_t *words; uint8_t *offs; sym_t *sym; uint16_t *ranks; uint64_t *rec; uint32_t x[MAX_LANES];
                 size_t first, nwords, noffs; int lanes, avx2, zmm, wide_zmm, small_zmm, bytes_table; } enc_t;
/* The bins and offsets of 8-bit values, 64 at a time with AVX-512 VBMI
 * (below; zmm set only where it runs): how many values it did, a multiple
 * of 64, with the bit stream's state as encode_body keeps it. */
static Py_ssize_t offsets_bytes_zmm(const uint8_t *v, Py_ssize_t n, const uint16_t *rank_of, const uint32_t *lower,
                                    const uint8_t *obits, uint16_t *ranks, uint8_t *offs, size_t *noffs,
                                    uint64_t *acc, int *fill, uint64_t *outside);
/* A wide block's whole groups of 32 values with AVX2 (below); rec: two
 * 64-bit records a bin. Where it is built: the x86 hosts. */
static uint16_t *wide_encode_avx2(const uint64_t *rec, const uint16_t *ranks, Py_ssize_t whole, uint32_t *xs,
                                  uint16_t *ptr, int P);
/* The same from one 64-bit record a bin (P <= 12): m | freq << 32 | cum << 45
 * | l << 57, half the gathers; x_max is freq << (32 - P). */
#define PACKED_MAX_P 12
static uint16_t *wide_encode_avx2_packed(const uint64_t *rec, const uint16_t *ranks, Py_ssize_t whole, uint32_t *xs,
                                         uint16_t *ptr, int P);
static uint16_t *wide_encode_zmm(const uint64_t *rec, const uint16_t *ranks, Py_ssize_t whole, uint32_t *xs,
                                 uint16_t *ptr, int P);  /* the same with AVX-512 (where wide_zmm_usable) */
/* The same for a block of at most SMALL_ENC_BINS bins from its fields in
 * registers (small: m, x_max, freq | cum << 16 and l, SMALL_ENC_BINS each),
 * and for one of at most PAIRED_ENC_BINS at P <= PACKED_MAX_P (paired: m,
 * then freq | cum << 13 | l << 25, PAIRED_ENC_BINS each). */
#define SMALL_ENC_BINS 32
#define PAIRED_ENC_BINS 64
static uint16_t *wide_encode_zmm_small(const uint32_t *small, const uint16_t *ranks, Py_ssize_t whole, uint32_t *xs,
                                       uint16_t *ptr, int P);
static uint16_t *wide_encode_zmm_paired(const uint32_t *paired, const uint16_t *ranks, Py_ssize_t whole, uint32_t *xs,
                                        uint16_t *ptr, int P);

/* BMI2's shifts take any register as the count, not only cl (fewer moves
 * and spills): the coder's loops shift by a value's width or a bin's. */
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_BMI2 1
#define BMI2 __attribute__((target("bmi2")))
CPU_HAS(cpu_has_bmi2, "bmi2")
CPU_HAS(cpu_has_avx512f, "avx512f")
#endif

static inline void store8(uint8_t *p, uint64_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    memcpy(p, &v, 8);
}

/* encode_body's bins and offsets of 8-bit values (its OFFSETS loop, the
 * same bytes), eight at a time, from one table of the 256 values' bin,
 * offset width and offset (where the loop loads three tables a value and
 * checks each offset against its width: here an entry tells a value
 * outside its bin, once for all 256), four offsets (at most 32 bits) a
 * store. An entry of a value outside its bin (which the caller's error
 * then discards) holds no offset: the stream never runs past its buffer.
 * How many values it did, a multiple of 8. AMD's Zen 3, benchmarks/
 * coder_kernels.py against the loop, encode_block on bytes, four rounds
 * interleaved, ns a value: gemma3 3.27-3.37 -> 2.97-3.06, minilm-int8
 * 3.24-3.36 -> 2.96-3.13, smollm2 3.27-3.37 -> 3.16-3.25 (8 values a
 * store where every offset is at most 7 bits was no faster). */
#define BYTE_OUTSIDE (1u << 24)  /* an entry's flag: the value lies outside its bin */
static inline __attribute__((always_inline))
Py_ssize_t offsets_bytes_table(const uint8_t *v, Py_ssize_t n, const uint16_t *rank_of, const uint32_t *lower,
                               const uint8_t *obits, uint16_t *ranks, uint8_t *offs, size_t *noffs_io,
                               uint64_t *acc_io, int *fill_io, uint64_t *outside_io) {
    uint32_t tab[256];  /* bin | width << 8 | offset << 16, or the bin | BYTE_OUTSIDE */
    for (int x = 0; x < 256; x++) {
        uint32_t r = rank_of[x], w = obits[r];
        uint64_t off = (uint32_t)((uint32_t)x - lower[r]);
        tab[x] = w <= 8 && !(off >> w) ? r | w << 8 | (uint32_t)off << 16 : r | BYTE_OUTSIDE;  /* bins <= 256 */
    }
    uint32_t bad = 0;
    uint64_t acc = *acc_io;
    int fill = *fill_io;
    size_t noffs = *noffs_io;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int h = 0; h < 8; h += 4) {  /* fill < 8 before, four offsets <= 32 bits: within 64 */
            for (int k = h; k < h + 4; k++) {
                uint32_t e = tab[v[i + k]];
                bad |= e;
                ranks[i + k] = (uint16_t)(e & 0xff);
                acc |= (uint64_t)(e >> 16) << fill;
                fill += (int)((e >> 8) & 0xff);
            }
            store8(offs + noffs, acc);
            int whole = fill >> 3;
            noffs += (size_t)whole;
            acc >>= 8 * whole;  /* whole <= 4 */
            fill &= 7;
        }
    if (bad & BYTE_OUTSIDE) *outside_io |= 1;
    *acc_io = acc;
    *fill_io = fill;
    *noffs_io = noffs;
    return i;
}
#undef BYTE_OUTSIDE

#define ENCODE_PARAMS const uint16_t *rank_of, int shift, const void *values, Py_ssize_t n, int width, \
                      const uint32_t *freq, const uint32_t *cum, const uint32_t *lower, const uint8_t *obits, \
                      Py_ssize_t bins, int P, enc_t *e
#define ENCODE_ARGS rank_of, shift, values, n, width, freq, cum, lower, obits, bins, P, e
static inline __attribute__((always_inline)) int encode_body(ENCODE_PARAMS) {
    size_t cap = (size_t)n * 2 + 2;
    uint16_t *words = e->words, *ranks = e->ranks;
    uint8_t *offs = e->offs;
    sym_t *sym = e->sym;
    size_t first = 0, nwords = 0, noffs = 0;
    uint32_t *x = e->x;
    /* any bit set: a bin without frequency or wider than 32 bits (checked
     * first: the widths bound the bit stream's stores below), or a value
     * outside its bin */
    uint64_t outside = 0;
    for (Py_ssize_t r = 0; r < bins; r++) outside |= !freq[r] || obits[r] > 32;
    if (!outside) {   /* bins and offsets, forwards, without a branch: `group` values
         * (as many as fit 64 bits after the 7 a flush may leave) are added
         * to the bit stream, then its whole bytes stored (8 bytes stored,
         * the whole ones kept); the bytes are those of one little-endian
         * bit stream either way */
        uint32_t widest = 0;
        for (Py_ssize_t r = 0; r < bins; r++) widest = obits[r] > widest ? obits[r] : widest;
        int group = widest ? (int)(57 / widest) : 8;
        if (group > 8) group = 8;
        if (group < 1) group = 1;
        uint64_t acc = 0; int fill = 0;
        Py_ssize_t done = 0;  /* values whose bins and offsets are set */
        if (e->zmm && width == 1)
            done = offsets_bytes_zmm(values, n, rank_of, lower, obits, ranks, offs, &noffs, &acc, &fill, &outside);
        else if (e->bytes_table && width == 1)
            done = offsets_bytes_table(values, n, rank_of, lower, obits, ranks, offs, &noffs, &acc, &fill, &outside);
#define OFFSETS(T) { const T *v = values; \
        for (Py_ssize_t i = done; i < n;) { \
            Py_ssize_t stop = i + group < n ? i + group : n; \
            for (; i < stop; i++) { \
                uint32_t value = v[i], r = rank_of[value >> shift]; \
                ranks[i] = (uint16_t)r; \
                uint32_t w = obits[r]; \
                uint64_t off = (uint32_t)(value - lower[r]); \
                outside |= off >> w; \
                acc |= off << fill; fill += w; \
            } \
            store8(offs + noffs, acc); \
            int whole = fill >> 3; \
            noffs += whole; acc = whole < 8 ? acc >> (8 * whole) : 0; fill &= 7; \
        } }
        if (width == 1) OFFSETS(uint8_t) else if (width == 2) OFFSETS(uint16_t) else OFFSETS(uint32_t)
#undef OFFSETS
        while (fill > 0) { offs[noffs++] = (uint8_t)acc; acc >>= 8; fill -= 8; }
    }
    if (!outside) {
        uint16_t *end = words + cap, *ptr = end;
        /* x / f without a division: (x * M) >> (32 + l), M = ceil(2^(32+l) / f),
         * l = ceil(log2 f), exact for every 32-bit x (Granlund and Montgomery).
         * 2^32 <= M < 2^33: with m = M - 2^32, that is (x + (x * m >> 32)) >> l,
         * in 64 bits. One record a bin: one load a value, not four tables'. */
        for (Py_ssize_t r = 0; r < bins; r++) {
            uint32_t f = freq[r], l = 0;
            while (((uint64_t)1 << l) < f) l++;
            sym[r].m = (uint32_t)((((unsigned __int128)1 << (32 + l)) + f - 1) / f - ((uint64_t)1 << 32));
            sym[r].l = l;
            sym[r].x_max = ((uint64_t)1 << (32 - P)) * f;
            sym[r].freq = f;
            sym[r].cum = cum[r];
        }
        /* bins, backwards: the values past the last whole group of four,
         * then groups of four with each state in a register */
#define ENC(X, I) { \
            const sym_t *s = &sym[ranks[I]]; \
            /* renormalize without a branch (it mispredicts on high-entropy bins): \
             * the word is written either way, below the words kept */ \
            uint32_t need = X >= s->x_max; \
            ptr[-1] = (uint16_t)(X & 0xffff); ptr -= need; X >>= need << 4; \
            uint32_t q = (uint32_t)(((uint64_t)X + ((uint64_t)X * s->m >> 32)) >> s->l); \
            X = (q << P) + (X - q * s->freq) + s->cum; \
        }
        if (bins == 1) {
            /* one bin (its frequency 2^P, so m = 0, l = P and x_max = 2^32): each
             * step leaves its state as it was and writes no word, the values
             * are their offsets alone, so the steps are left out (a field of
             * near-uniform low bits: encode_block of 2^19 uniform 5 and 12-bit
             * values 3.0 -> 0.9 and 3.8 -> 1.7 ns a value, best of 40) */
            for (int k = 0; k < e->lanes; k++) x[k] = RANS_L;
        } else if (e->lanes == LANES) {
            uint32_t x0 = RANS_L, x1 = RANS_L, x2 = RANS_L, x3 = RANS_L;
            Py_ssize_t whole = n & ~(Py_ssize_t)(LANES - 1);
            for (Py_ssize_t i = n - 1; i >= whole; i--) {
                switch (i & 3) {
                case 0: ENC(x0, i) break;
                case 1: ENC(x1, i) break;
                case 2: ENC(x2, i) break;
                default: ENC(x3, i) break;
                }
            }
            for (Py_ssize_t i = whole - LANES; i >= 0; i -= LANES) {
                ENC(x3, i + 3) ENC(x2, i + 2) ENC(x1, i + 1) ENC(x0, i)
            }
            x[0] = x0; x[1] = x1; x[2] = x2; x[3] = x3;
        } else {  /* a wide block: value i in state i % 32, the same steps, whole groups without a modulo */
            for (Py_ssize_t k = 0; k < WIDE_LANES; k++) x[k] = RANS_L;
            Py_ssize_t whole = n & ~(Py_ssize_t)(WIDE_LANES - 1);
            for (Py_ssize_t i = n - 1; i >= whole; i--) {
                uint32_t X = x[i - whole];
                ENC(X, i)
                x[i - whole] = X;
            }
            if (e->avx2 && !e->wide_zmm && P <= PACKED_MAX_P) {
                uint64_t *rec = e->rec;
                for (Py_ssize_t r = 0; r < bins; r++)
                    rec[r] = sym[r].m | (uint64_t)sym[r].freq << 32 | (uint64_t)sym[r].cum << 45 | (uint64_t)sym[r].l << 57;
                ptr = wide_encode_avx2_packed(rec, ranks, whole, x, ptr, P);
            } else if (e->small_zmm && bins <= SMALL_ENC_BINS) {  /* (small_zmm: wide_zmm and avx2 too) */
                uint32_t small[4 * SMALL_ENC_BINS] = {0};
                for (Py_ssize_t r = 0; r < bins; r++) {
                    small[r] = sym[r].m;
                    small[SMALL_ENC_BINS + r] = (uint32_t)sym[r].x_max;  /* below 2^32: two bins or more */
                    small[2 * SMALL_ENC_BINS + r] = sym[r].freq | sym[r].cum << 16;
                    small[3 * SMALL_ENC_BINS + r] = sym[r].l;
                }
                ptr = wide_encode_zmm_small(small, ranks, whole, x, ptr, P);
            } else if (e->small_zmm && bins <= PAIRED_ENC_BINS && P <= PACKED_MAX_P) {
                uint32_t paired[2 * PAIRED_ENC_BINS] = {0};
                for (Py_ssize_t r = 0; r < bins; r++) {
                    paired[r] = sym[r].m;
                    paired[PAIRED_ENC_BINS + r] = sym[r].freq | sym[r].cum << 13 | sym[r].l << 25;
                }
                ptr = wide_encode_zmm_paired(paired, ranks, whole, x, ptr, P);
            } else if (e->avx2) {
                uint64_t *rec = e->rec;
                for (Py_ssize_t r = 0; r < bins; r++) {
                    rec[2 * r] = sym[r].m | sym[r].x_max << 32;
                    rec[2 * r + 1] = sym[r].freq | sym[r].cum << 16 | (uint64_t)sym[r].l << 32;
                }
                ptr = (e->wide_zmm ? wide_encode_zmm : wide_encode_avx2)(rec, ranks, whole, x, ptr, P);
            } else {
                for (Py_ssize_t i = whole - WIDE_LANES; i >= 0; i -= WIDE_LANES)
                    for (int k = WIDE_LANES - 1; k >= 0; k--) {
                        uint32_t X = x[k];
                        ENC(X, i + k)
                        x[k] = X;
                    }
            }
        }
#undef ENC
        nwords = (size_t)(end - ptr);
        first = (size_t)(ptr - words);  /* left where they are: put_rans copies them once */
    }
    e->first = first;
    e->nwords = nwords;
    e->noffs = noffs;
    return outside ? -1 : 0;
}

static int encode_plain(ENCODE_PARAMS) { return encode_body(ENCODE_ARGS); }
#ifdef HAVE_BMI2
BMI2 static int encode_bmi2(ENCODE_PARAMS) { return encode_body(ENCODE_ARGS); }  /* 20 % faster here */
#endif

/* simd 0: the plain loops wherever it runs (the tests hold both to the same bytes). */
static int encode_core(ENCODE_PARAMS, int simd) {
#ifdef HAVE_BMI2
    if (simd && cpu_has_bmi2()) return encode_bmi2(ENCODE_ARGS);
#endif
    (void)simd;
    return encode_plain(ENCODE_ARGS);
}

/* The rANS bytes of an encoding: the final states, then the words, little-endian. */
static void put_rans(const enc_t *e, uint8_t *out) {
    const int lanes = e->lanes;
    for (int k = 0; k < lanes; k++)
        for (int j = 0; j < 4; j++) out[4 * k + j] = (uint8_t)(e->x[k] >> (8 * j));
    const uint16_t *words = e->words + e->first;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(out + 4 * lanes, words, 2 * e->nwords);
#else
    for (size_t w = 0; w < e->nwords; w++) {  /* little-endian on every host */
        out[4 * lanes + 2 * w] = (uint8_t)(words[w] & 0xff);
        out[4 * lanes + 2 * w + 1] = (uint8_t)(words[w] >> 8);
    }
#endif
}

/* The decoder's fast path, for P <= 15 (a slot's frequency and bias then
 * share 32 bits): a batch of BATCH values, first their bins, then their
 * offsets.
 * Bins: groups of four values, one per state. The four states step apart
 * (one table load each, `stab`, below); which of
 * them renormalize decides where each one's word lies among the next four
 * words, loaded before, so no state waits for another's renormalization
 * (the scalar loop's shared word pointer chained them).
 * Offsets: a value's bit position is the sum of the widths before it, and
 * each is read with its own 64-bit load at that position, so reads do not
 * wait on each other either. Small functions, so that the states and the
 * position stay in registers. Past the end of a stream both read zeros;
 * the caller then reports the stream damaged. */
#define BATCH 256
/* Groups of four values of each block an engine call decodes (below): the
 * call loads and saves its blocks' states once for them. 32 against 16,
 * coder_kernels' decode_streams in one process, three rounds: pocketnet
 * 16-bit 2.20-2.24 -> 2.01-2.11 ns a value, ppocr 23-bit 1.83-1.93 ->
 * 1.74-1.80; one-shot unpacks in fresh processes, ten each interleaved,
 * mean ms: pocketnet 19.5 -> 17.1, taesd 13.1 -> 12.6, ppocr 30.9 -> 30.2;
 * benchmarks/ab.py later (eight each, 129fded against 2672b8b, this the
 * change on these items), the means' ratios: pocketnet 0.991, taesd 0.978,
 * ppocr 0.914. 64 did no better than 32 (a block's last values, fewer
 * than a call takes, go alone: narrow_finish). */
#define MULTI_GROUPS 32
/* stab[slot]: the slot's frequency | its bias << 16 in the low half (the
 * state's step), its bin's first key | offset width << 16 in the high half
 * (what the offsets pass needs: one load per value, no second table). */
typedef struct { const uint64_t *stab; int P; uint32_t mask; int shift; } fast_t;

/* The 8 bytes at p, little-endian, unchecked. */
static inline uint64_t load8(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

/* The 8 bytes of `base` (`limit` bytes) from byte `at`, little-endian; zeros past the end. */
static inline uint64_t load_bits(const uint8_t *base, uint64_t limit, uint64_t at) {
    if (__builtin_expect(at + 8 <= limit, 1)) return load8(base + at);
    uint64_t v = 0;
    for (int k = 0; at + k < limit && k < 8; k++) v |= (uint64_t)base[at + k] << (8 * k);
    return v;
}

/* A batch's bins (their ranks into rb) from the words from byte `at` of
 * `in` (`limit` bytes); the new `at`. Then its values from their bins and
 * their offsets from bit `pos` of `base` (`limit` bytes); the new pos.
 * A batch reads at most FAST_WORD_READS bytes of words past `at` and
 * offset_reads(BATCH, the block's widest offset) bytes of offsets past
 * its first (4 * BATCH + 4 with offsets of 32 bits): where those lie
 * inside the stream the loads go unchecked (the _unchecked variants), else
 * through load_bits. The fused pass does both at once, one batch's bins
 * while reading the offsets of the batch before (prev): the bins are a
 * chain of dependent steps that leaves the CPU's units idle, which the
 * offsets, independent of it, fill. Not inlined, so that the states and
 * the positions keep registers of their own; with BMI2 where the CPU has
 * it (shifts by any register, not only cl: fewer moves and spills). */
/* GCC's straight-line vectorizer packs a group's four table entries into
 * vector registers to store them, through the stack: scalar stores are cheaper. */
#if defined(__GNUC__) && !defined(__clang__)
#define NO_SLP __attribute__((optimize("no-tree-slp-vectorize")))
#else
#define NO_SLP
#endif
#define FAST_WORD_READS (2 * BATCH + 8)
typedef uint64_t (*bins_fn)(const fast_t *, uint32_t *, const uint8_t *, uint64_t, uint64_t, uint32_t *);
typedef uint64_t (*offsets_fn)(const fast_t *, const uint32_t *, const uint8_t *, uint64_t, uint64_t, void *, int);
typedef void (*fused_fn)(const fast_t *, uint32_t *, const uint8_t *, uint64_t *, uint32_t *, const uint32_t *,
                         const uint8_t *, uint64_t *, void *);

#define LANE(X, K) uint64_t e##K = stab[X & mask]; \
    rb[j + K] = (uint32_t)(e##K >> 32); \
    X = (uint32_t)(e##K & 0xffff) * (X >> P) + ((uint32_t)e##K >> 16); \
    uint32_t n##K = X < RANS_L;
/* renormalization without a branch: it mispredicts on high-entropy bins */
#define FEED(X, K, C) X = (X << (n##K << 4)) | ((uint32_t)(words >> (16 * (C))) & (0xffffu & (0u - n##K)));
#define GROUP(LOAD) \
        uint64_t words = LOAD; \
        LANE(x0, 0) LANE(x1, 1) LANE(x2, 2) LANE(x3, 3) \
        uint32_t c1 = n0, c2 = c1 + n1, c3 = c2 + n2; \
        FEED(x0, 0, 0) FEED(x1, 1, c1) FEED(x2, 2, c2) FEED(x3, 3, c3) \
        at += 2 * (c3 + n3);
#define OFFSET(J, LOAD) { \
        uint32_t t = prev[J], w = t >> 16; \
        out[J] = (__typeof__(*out))(((t & 0xffff) << shift) + (uint32_t)((LOAD >> (pos & 7)) & ((1ull << w) - 1))); \
        pos += w; }

#define FAST_BINS(NAME, LOAD, TARGET) \
__attribute__((noinline)) NO_SLP TARGET \
static uint64_t NAME(const fast_t *f, uint32_t *xs, const uint8_t *in, uint64_t limit, uint64_t at, uint32_t *rb) { \
    uint32_t x0 = xs[0], x1 = xs[1], x2 = xs[2], x3 = xs[3]; \
    const uint64_t *stab = f->stab; const uint32_t mask = f->mask; const int P = f->P; \
    (void)limit; \
    for (int j = 0; j < BATCH; j += LANES) { GROUP(LOAD) } \
    xs[0] = x0; xs[1] = x1; xs[2] = x2; xs[3] = x3; \
    return at; \
}
#define FAST_OFFSETS(NAME, T, LOAD, TARGET) \
__attribute__((noinline)) NO_SLP TARGET \
static uint64_t NAME(const fast_t *f, const uint32_t *prev, const uint8_t *base, uint64_t limit, uint64_t pos, \
                     void *dst, int widest) { \
    const int shift = sizeof(T) == 4 ? f->shift : 0; \
    T *out = dst; \
    (void)limit; \
    if (!widest) { /* no bin has offset bits: each value is its bin's lower */ \
        for (int j = 0; j < BATCH; j++) out[j] = (T)((prev[j] & 0xffff) << shift); \
        return pos; \
    } \
    for (int j = 0; j < BATCH; j++) OFFSET(j, LOAD) \
    return pos; \
}
#define FAST_FUSED(NAME, T, TARGET) \
__attribute__((noinline)) NO_SLP TARGET \
static void NAME(const fast_t *f, uint32_t *xs, const uint8_t *in, uint64_t *wat, uint32_t *rb, \
                 const uint32_t *prev, const uint8_t *base, uint64_t *opos, void *dst) { \
    uint32_t x0 = xs[0], x1 = xs[1], x2 = xs[2], x3 = xs[3]; \
    const uint64_t *stab = f->stab; const uint32_t mask = f->mask; const int P = f->P; \
    const int shift = sizeof(T) == 4 ? f->shift : 0; \
    T *out = dst; \
    uint64_t at = *wat, pos = *opos; \
    for (int j = 0; j < BATCH; j += LANES) { \
        GROUP(load8(in + at)) \
        OFFSET(j, load8(base + (pos >> 3))) OFFSET(j + 1, load8(base + (pos >> 3))) \
        OFFSET(j + 2, load8(base + (pos >> 3))) OFFSET(j + 3, load8(base + (pos >> 3))) \
    } \
    xs[0] = x0; xs[1] = x1; xs[2] = x2; xs[3] = x3; \
    *wat = at; *opos = pos; \
}
#define FAST_KERNELS(SUFFIX, TARGET) \
FAST_BINS(fast_bins##SUFFIX, load8(in + at), TARGET) \
FAST_OFFSETS(fast_offsets8##SUFFIX, uint8_t, load8(base + (pos >> 3)), TARGET) \
FAST_OFFSETS(fast_offsets16##SUFFIX, u16u, load8(base + (pos >> 3)), TARGET) \
FAST_OFFSETS(fast_offsets32##SUFFIX, u32u, load8(base + (pos >> 3)), TARGET) \
FAST_FUSED(fast_fused8##SUFFIX, uint8_t, TARGET) \
FAST_FUSED(fast_fused16##SUFFIX, u16u, TARGET) \
FAST_FUSED(fast_fused32##SUFFIX, u32u, TARGET)
FAST_KERNELS(_unchecked, )
#ifdef HAVE_BMI2
FAST_KERNELS(_bmi2, BMI2)
#endif
FAST_BINS(fast_bins_checked, load_bits(in, limit, at), )
FAST_OFFSETS(fast_offsets8_checked, uint8_t, load_bits(base, limit, pos >> 3), )
FAST_OFFSETS(fast_offsets16_checked, u16u, load_bits(base, limit, pos >> 3), )
FAST_OFFSETS(fast_offsets32_checked, u32u, load_bits(base, limit, pos >> 3), )
#undef FAST_KERNELS
#undef FAST_FUSED
#undef FAST_OFFSETS
#undef FAST_BINS
#undef OFFSET
#undef GROUP
#undef FEED
#undef LANE

/* Whether a block's model is sound: `bins` bins (1 to 2^P and 65,536) in
 * cumulative order, none empty, frequencies summing to 2^P, offsets no
 * wider than the values. NULL, or what is wrong. */
static const char *check_model(const uint32_t *freq, const uint32_t *cum, const uint8_t *obits, Py_ssize_t bins,
                               int P, int width) {
    uint32_t M = 1u << P, total = 0;
    if (bins < 1 || bins > (Py_ssize_t)M || bins > 65536) return "bad model";
    for (Py_ssize_t r = 0; r < bins; r++) {
        if (freq[r] == 0 || cum[r] != total || freq[r] > M - total || obits[r] > 8 * width) return "bad model";
        total += freq[r];
    }
    return total == M ? NULL : "bad model";
}

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
/* build_stab's loop eight entries a store: a bin's entries are its first
 * one plus j << 16, the last store of a bin masked to what is left. */
__attribute__((target("avx512f")))
static void fill_stab_zmm(const uint32_t *freq, const uint32_t *lower, const uint8_t *obits, Py_ssize_t bins,
                          int shift, uint64_t *stab) {
    const __m512i steps = _mm512_setr_epi64(0, 1 << 16, 2 << 16, 3 << 16, 4 << 16, 5 << 16, 6 << 16, 7 << 16);
    const __m512i eight = _mm512_set1_epi64(8 << 16);
    for (Py_ssize_t r = 0, t = 0; r < bins; r++) {
        uint64_t first = (uint64_t)((lower[r] >> shift) | (uint32_t)obits[r] << 16) << 32 | freq[r];
        __m512i e = _mm512_add_epi64(_mm512_set1_epi64((long long)first), steps);
        uint32_t j = 0, f = freq[r];
        for (; j + 8 <= f; j += 8, t += 8, e = _mm512_add_epi64(e, eight)) _mm512_storeu_si512((void *)(stab + t), e);
        if (j < f) { _mm512_mask_storeu_epi64((void *)(stab + t), (__mmask8)((1u << (f - j)) - 1), e); t += f - j; }
    }
}
#endif

/* The fast path's slot table of a checked model (P <= 15): see fast_t.
 * Returns the widest offset of any bin (0: no bin has offset bits).
 * `simd` 0: the plain loop (the tests hold both to the same values). */
static int build_stab(const uint32_t *freq, const uint32_t *lower, const uint8_t *obits, Py_ssize_t bins, int shift,
                      uint64_t *stab, int simd) {
    int widest = 0;
    for (Py_ssize_t r = 0; r < bins; r++) if (obits[r] > widest) widest = obits[r];
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
    if (simd && cpu_has_avx512f()) {
        fill_stab_zmm(freq, lower, obits, bins, shift, stab);
        return widest;
    }
#endif
    for (Py_ssize_t r = 0, t = 0; r < bins; r++) {
        uint64_t hi = (uint64_t)((lower[r] >> shift) | (uint32_t)obits[r] << 16) << 32;
        for (uint32_t j = 0; j < freq[r]; j++, t++) stab[t] = hi | freq[r] | j << 16;
    }
    return widest;
}

/* The bytes past byte pos >> 3 that the offsets of `count` values, none
 * wider than `widest` bits, may read: the last one's 8-byte load starts at
 * most (7 + (count - 1) * widest) / 8 bytes on. MULTI_OFFSET_READS
 * bounds it for an engine call at any width; a block whose offsets are
 * narrower (most are: 0 to 8 bits) keeps its unchecked loads, and its
 * slot of the engine, until far closer to the end of what may be read.
 * (A stream of one block has nothing after its offsets: with the 32-bit
 * bound its last 1 KiB of offsets went the checked way, a third of
 * decoding piper's one-block 8-bit streams.) */
static inline uint64_t offset_reads(int count, int widest) {
    return (uint64_t)(7 + (count - 1) * widest) / 8 + 8;
}

/* A narrow block on the fast path, where it has got to: its rANS bytes
 * (in, limit: the four states, then the words; at: the next word), its
 * offset bits (offs, olimit bytes; pos: the next bit), the n values of
 * `width` bytes it decodes into out (i done), the four states, its slot
 * table. `stream`: its stream's position in a decode_streams call.
 * wread, oread: the bytes that may be read from in and from offs, past
 * the block's own where its stream goes on after it (its offsets follow
 * its words, the next block its offsets): the unchecked loads need a
 * margin of readable bytes, not of the block's, so that a block followed
 * by another is not finished one checked value at a time for its last few
 * hundred. Reading past the block is harmless: its words and offsets used
 * are checked against limit and olimit after every batch and call. */
typedef struct {
    const uint8_t *in, *offs;
    uint64_t limit, at, olimit, pos, wread, oread;
    uint8_t *out;
    Py_ssize_t n, i, stream;
    uint32_t x[LANES];
    fast_t f;
    int widest;  /* its widest offset, bits (0: none) */
    uint64_t oreads, mreads;  /* offset bytes a batch and an engine call may read (offset_reads) */
} narrow_t;

/* The most bytes of offsets a batch may read past its first: offset_reads(BATCH, 32). */
#define OFFSET_READS_MOST ((7 + (BATCH - 1) * 32) / 8 + 8)

/* The most bytes past a block that narrow_t's wread and oread count. */
#define SPARE_MOST 4096

/* The first four bytes of p, little-endian. */
static inline uint32_t load4(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Start a narrow block (its model checked, its slot table built in stab);
 * `spare`: the bytes of its stream after it (narrow_t's wread, oread).
 * NULL, or what is wrong. */
static const char *narrow_start(narrow_t *b, const uint8_t *in, Py_ssize_t inlen, const uint8_t *offs,
                                Py_ssize_t offslen, Py_ssize_t spare, Py_ssize_t n, void *out, uint64_t *stab,
                                int P, int shift, int widest) {
    if (inlen < 4 * LANES || (inlen - 4 * LANES) % 2) return "damaged stream (length)";
    b->in = in; b->limit = (uint64_t)inlen; b->at = 4 * LANES;
    b->offs = offs; b->olimit = (uint64_t)offslen; b->pos = 0;
    if (spare > SPARE_MOST) spare = SPARE_MOST;
    b->oread = (uint64_t)(offslen + spare);
    b->wread = offs == in + inlen ? (uint64_t)inlen + b->oread : (uint64_t)inlen;
    b->out = out; b->n = n; b->i = 0;
    b->f.stab = stab; b->f.P = P; b->f.mask = (1u << P) - 1; b->f.shift = shift;
    b->widest = widest;
    b->oreads = offset_reads(BATCH, widest);
    /* (+ 8: the AVX2 engine reads a group's offsets as the 16 bytes from its first one's byte) */
    b->mreads = offset_reads(4 * MULTI_GROUPS, widest) + 8;
    for (int k = 0; k < LANES; k++) {
        b->x[k] = load4(in + 4 * k);
        if (b->x[k] < RANS_L) return "damaged stream";
    }
    return NULL;
}

/* The rest of a started narrow block: whole batches (bins, then the
 * offsets of the batch before them, fused where both streams have room),
 * then one value at a time, then the checks that it ended where its
 * encoder began: every state back at 2^16, every word read, every offset
 * byte read and its padding bits zero. NULL, or what is wrong.
 * `simd` 0: the batches without BMI2. */
static const char *narrow_finish(narrow_t *b, int width, int simd) {
    const fast_t *f = &b->f;
    const uint8_t *in = b->in, *ostart = b->offs;
    const uint64_t limit = b->limit, olimit = b->olimit, wread = b->wread, oread = b->oread, oreads = b->oreads;
    uint64_t at = b->at, pos = b->pos;
    Py_ssize_t i = b->i, n = b->n;
    const int widest = b->widest, k = width == 1 ? 0 : width == 2 ? 1 : 2;
    int bad = 0;
    static const offsets_fn checked[3] = {fast_offsets8_checked, fast_offsets16_checked, fast_offsets32_checked};
    bins_fn bins = fast_bins_unchecked;
    offsets_fn offsets = (offsets_fn[3]){fast_offsets8_unchecked, fast_offsets16_unchecked, fast_offsets32_unchecked}[k];
    fused_fn fused = (fused_fn[3]){fast_fused8_unchecked, fast_fused16_unchecked, fast_fused32_unchecked}[k];
#ifdef HAVE_BMI2
    if (simd && cpu_has_bmi2()) {
        bins = fast_bins_bmi2;
        offsets = (offsets_fn[3]){fast_offsets8_bmi2, fast_offsets16_bmi2, fast_offsets32_bmi2}[k];
        fused = (fused_fn[3]){fast_fused8_bmi2, fast_fused16_bmi2, fast_fused32_bmi2}[k];
    }
#endif
    /* rb[cur]: the bins of the batch before i, whose offsets are still to read (where `pending`) */
    uint32_t rb[2][BATCH];
    int cur = 0, pending = 0;
    uint8_t *ob = b->out;
    /* Once a batch's offsets may reach past what may be read, the offsets
     * left (fewer than `oreads` bytes) are read from a copy padded with
     * zeros, as load_bits reads past a stream's end, with the unchecked
     * loads: `obase` is where the offsets are read from, `oskip` the bits
     * before it. A block whose offsets are few (exponent bytes: a few
     * hundred bytes of them in all) went the checked way from its start:
     * 30,000 of them alone 7.0 ns a value, 35 % of it in load_bits. */
    uint8_t otail[2 * OFFSET_READS_MOST];
    const uint8_t *obase = ostart;
    uint64_t oskip = 0;
    while (!bad && i + BATCH <= n) {
        int words_safe = at + FAST_WORD_READS <= wread;
        if (obase == ostart && (pos >> 3) + oreads > oread && (pos >> 3) < olimit) {
            size_t from = (size_t)(pos >> 3), len = (size_t)(olimit - from);  /* < oreads */
            memcpy(otail, ostart + from, len);
            memset(otail + len, 0, sizeof otail - len);
            obase = otail;
            oskip = 8 * (uint64_t)from;
        }
        /* checked[k] runs only while obase is ostart (oskip 0): one call for either */
        int offsets_safe = obase != ostart || (pos >> 3) + oreads <= oread;
        uint64_t rel = pos - oskip;
        if (pending && widest && words_safe && offsets_safe) {
            fused(f, b->x, in, &at, rb[cur ^ 1], rb[cur], obase, &rel, ob + (i - BATCH) * width);
            cur ^= 1;
        } else {
            if (pending)
                rel = (offsets_safe ? offsets : checked[k])(f, rb[cur], obase, olimit, rel, ob + (i - BATCH) * width,
                                                            widest);
            at = (words_safe ? bins : fast_bins_checked)(f, b->x, in, limit, at, rb[cur]);
        }
        pos = rel + oskip;
        pending = 1;
        i += BATCH;
        if (pos > 8 * olimit || at > limit) bad = 1;
    }
    if (pending && !bad) {
        int offsets_safe = obase != ostart || (pos >> 3) + oreads <= oread;
        uint64_t rel = pos - oskip;
        rel = (offsets_safe ? offsets : checked[k])(f, rb[cur], obase, olimit, rel, ob + (i - BATCH) * width, widest);
        pos = rel + oskip;
        if (pos > 8 * olimit) bad = 1;
    }
    /* the last values, each with its checks */
    for (; i < n && !bad; i++) {
        uint32_t X = b->x[i & 3];
        uint64_t e = f->stab[X & f->mask];
        X = (uint32_t)(e & 0xffff) * (X >> f->P) + ((uint32_t)e >> 16);
        if (X < RANS_L) {
            if (at + 2 > limit) { bad = 1; break; }
            X = (X << 16) | (uint32_t)in[at] | (uint32_t)in[at + 1] << 8;
            at += 2;
        }
        b->x[i & 3] = X;
        uint32_t t = (uint32_t)(e >> 32), w = t >> 16, v = (t & 0xffff) << (width == 4 ? f->shift : 0);
        if (w) {
            if (pos + w > 8 * olimit) { bad = 1; break; }
            v += (uint32_t)((load_bits(ostart, olimit, pos >> 3) >> (pos & 7)) & (((uint64_t)1 << w) - 1));
            pos += w;
        }
        if (width == 1) ob[i] = (uint8_t)v; else if (width == 2) ((u16u *)ob)[i] = (uint16_t)v; else ((u32u *)ob)[i] = v;
    }
    if (!bad) {
        for (int j = 0; j < LANES; j++) if (b->x[j] != RANS_L) bad = 1;
        if (at != limit || (pos + 7) / 8 != olimit || ((pos & 7) && (ostart[pos >> 3] >> (pos & 7)))) bad = 1;
    }
    b->at = at; b->pos = pos; b->i = i;
    return bad ? "damaged stream" : NULL;
}

/* Decode n values of `width` bytes into out from one block's rANS bytes
 * (in, inlen) and offset bits (offs, offslen), with the block's model:
 * `bins` bins in cumulative order, frequencies summing to 2^P, a bin's
 * lower value its first key << `shift`. Scratch: `slots` and `stab` (2^P
 * entries; stab unused for P > 15); `spare` as narrow_start's. NULL, or
 * what is wrong. Needs no GIL.
 * `simd` 0: the batches without BMI2 (the tests hold both to the same values). */
static const char *decode_core(const uint8_t *in, Py_ssize_t inlen, const uint8_t *offs, Py_ssize_t offslen,
                               Py_ssize_t spare, Py_ssize_t n, int width, const uint32_t *freq, const uint32_t *cum,
                               const uint32_t *lower, const uint8_t *obits, Py_ssize_t bins, int P, void *out,
                               uint16_t *slots, uint64_t *stab, int shift, int simd) {
    const char *error = check_model(freq, cum, obits, bins, P, width);
    if (error) return error;
    if (P <= 15 && n >= BATCH) {  /* the fast path, on the slot table */
        narrow_t b;
        int widest = build_stab(freq, lower, obits, bins, shift, stab, simd);
        error = narrow_start(&b, in, inlen, offs, offslen, spare, n, out, stab, P, shift, widest);
        return error ? error : narrow_finish(&b, width, simd);
    }
    if (inlen < 4 * LANES || (inlen - 4 * LANES) % 2) return "damaged stream (length)";
    uint32_t M = 1u << P;
    for (Py_ssize_t r = 0; r < bins; r++)
        for (uint32_t j = 0; j < freq[r]; j++) slots[cum[r] + j] = (uint16_t)r;
    uint32_t x[LANES];
    for (int k = 0; k < LANES; k++) x[k] = load4(in + 4 * k);
    const uint8_t *ptr = in + 4 * LANES, *end = in + inlen;
    const uint8_t *op = offs, *oend = op + offslen;
    uint8_t *o8 = out;
    u16u *o16 = out;
    u32u *o32 = out;
    uint32_t mask = M - 1;
    uint64_t acc = 0;
    int fill = 0, bad = 0;
    for (int k = 0; k < LANES; k++) if (x[k] < RANS_L) bad = 1;
    uint32_t x0 = x[0], x1 = x[1], x2 = x[2], x3 = x[3];
    /* One value from state X into out[I]: its bin, renormalization, offset bits. */
#define STEP(X, I) { \
        uint32_t slot = X & mask, r = slots[slot]; \
        X = freq[r] * (X >> P) + slot - cum[r]; \
        if (X < RANS_L) { \
            if (ptr + 2 > end) { bad = 1; break; } \
            X = (X << 16) | (uint32_t)ptr[0] | (uint32_t)ptr[1] << 8; ptr += 2; \
        } \
        uint32_t w = obits[r], v = lower[r]; \
        if (w) { \
            if (fill < (int)w) { \
                if (oend - op >= 4) { \
                    acc |= (uint64_t)load4(op) << fill; \
                    op += 4; fill += 32; \
                } \
                while (fill < (int)w && op < oend) { acc |= (uint64_t)*op++ << fill; fill += 8; } \
                if (fill < (int)w) { bad = 1; break; } \
            } \
            v += (uint32_t)(acc & (((uint64_t)1 << w) - 1)); acc >>= w; fill -= w; \
        } \
        if (width == 1) o8[I] = (uint8_t)v; else if (width == 2) o16[I] = (uint16_t)v; else o32[I] = v; \
    }
    Py_ssize_t i = 0;
    for (; i + LANES <= n && !bad; i += LANES) {
        do { STEP(x0, i); STEP(x1, i + 1); STEP(x2, i + 2); STEP(x3, i + 3); } while (0);
    }
    for (; i < n && !bad; i++) {
        switch (i & 3) {
        case 0: do { STEP(x0, i); } while (0); break;
        case 1: do { STEP(x1, i); } while (0); break;
        case 2: do { STEP(x2, i); } while (0); break;
        default: do { STEP(x3, i); } while (0); break;
        }
    }
#undef STEP
    if (!bad) {
        if (x0 != RANS_L || x1 != RANS_L || x2 != RANS_L || x3 != RANS_L) bad = 1;
        if (ptr != end || op != oend || fill >= 8 || acc) bad = 1;
    }
    return bad ? "damaged stream" : NULL;
}

/* A wide block: 32 states, value i in state i % 32, sharing one word
 * stream as the four of a narrow block do (after a value's step its state
 * takes the next word if it fell below 2^16, values in order). The AVX2
 * kernel takes 32 values at a time: four vectors of eight states step
 * independently (their table loads overlap), then renormalize in order,
 * each taking as many words as its lanes need, placed by a permutation
 * chosen from the lanes' mask; the offsets' positions are a prefix sum of
 * their widths, read with a gather. Frequencies below 2^16.
 * A slot's entry in etab: its frequency and bias (the coding step's) in
 * the low word, its bin's value in the high word: the lower value, and for
 * values of 16 bits or fewer the offset width above it (lower | width <<
 * 16). For 32-bit values the width comes from wtab, or from the value with
 * NULL for wtab where the lower value's low 6 bits are zero (a field of 22
 * bits or more: its key is its top 16 bits) and hold it; a 32-bit value's
 * offset (up to 7 + 32 bits from its byte) is read as a 64-bit item.
 * A kernel's contract: it decodes whole groups while one starts no further
 * than `wsafe` bytes into the words and `osafe` bits into the offsets (a
 * group reads at most 64 + 16 bytes of words past its start and 4 * 32 + 8
 * of offsets past its first position: the caller sets the limits so that
 * these lie inside its buffers), sets *done to the groups decoded, and
 * returns 1 where one ended past `wlimit` or `olimit` (a damaged stream). */
#define WIDE_READS 160  /* bytes a group may read past where it starts (32-bit values: 128 + 8 of offsets), rounded up */
static int32_t wide_perm[256][8];  /* lane k of mask m takes word popcount(m & ((1 << k) - 1)) */

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_WIDE_AVX2 1  /* (immintrin.h included with HAVE_BMI2, on the same hosts) */
/* Eight lanes' 64-bit items at byte offsets idx * scale from base, in two
 * gathers of four: lanes 0, 1, 4, 5 and 2, 3, 6, 7, so that one shuffle
 * takes their low halves in lane order (and another their high halves).
 * Gathers cost by the item: half as many items as two 32-bit gathers. */
#define PAIR_ORDER _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7)
/* The same where MASK (64-bit lanes, in the gathers' order) is set; zeros
 * elsewhere. AVX2's gathers always take a mask: all ones is the unmasked one. */
#define GATHER_PAIRS_MASKED(A, B, BASE, IDX, SCALE, MASK) { \
    __m256i q_ = _mm256_permutevar8x32_epi32((IDX), PAIR_ORDER); \
    A = _mm256_mask_i32gather_epi64(_mm256_setzero_si256(), (const long long *)(BASE), _mm256_castsi256_si128(q_), \
                                    (MASK), SCALE); \
    B = _mm256_mask_i32gather_epi64(_mm256_setzero_si256(), (const long long *)(BASE), _mm256_extracti128_si256(q_, 1), \
                                    (MASK), SCALE); \
}
#define GATHER_PAIRS(A, B, BASE, IDX, SCALE) GATHER_PAIRS_MASKED(A, B, BASE, IDX, SCALE, _mm256_set1_epi64x(-1))
/* GATHER_PAIRS(A, B, BASE, IDX, 8) by eight scalar loads: the indices
 * stored and read back, the items put together. On AMD's Zen 3 an AVX2
 * gather of four items costs more than the loads it stands for (one
 * thread, coder_kernels' decode_stream, ns a value, best of 9 in three
 * interleaved rounds: nomic 16-bit 1.54 -> 1.29, bytes 1.46 -> 1.22,
 * astra 23-bit mantissas 1.62 -> 1.35, pocketnet alike; astra's 16-bit
 * values about the same, 2.05-2.13 -> 1.96-2.16; a wide block of 2^19
 * values spread evenly over 300 to 20,000 keys, best of 9: 1.95 -> 1.53
 * at P 12 with 300 keys, 1.56 -> 1.33 with 4,000, 1.70 -> 1.45 at P 13,
 * 2.37 -> 2.18 at P 15). The wide decoder's tables of any size; not the
 * narrow engine's (eight blocks' tables, 256 KiB: 2.23-2.27 -> 2.36-2.38
 * a value with loads), nor the AVX-512 kernels (the Zen 4 and Intel
 * servers that have AVX-512 gather faster; not measured here). */
#define LOAD_PAIRS(A, B, BASE, IDX) { \
    uint32_t i_[8]; \
    _mm256_storeu_si256((__m256i *)i_, (IDX)); \
    LOAD_PAIRS_AT(A, B, BASE, i_); \
}
/* The same from eight indices in memory (I: any integer array). */
#define LOAD_PAIRS_AT(A, B, BASE, I) { \
    const uint64_t *b_ = (const uint64_t *)(BASE); \
    A = _mm256_setr_epi64x((long long)b_[(I)[0]], (long long)b_[(I)[1]], (long long)b_[(I)[4]], (long long)b_[(I)[5]]); \
    B = _mm256_setr_epi64x((long long)b_[(I)[2]], (long long)b_[(I)[3]], (long long)b_[(I)[6]], (long long)b_[(I)[7]]); \
}
#define LOW_HALVES(A, B) _mm256_castps_si256(_mm256_shuffle_ps(_mm256_castsi256_ps(A), _mm256_castsi256_ps(B), 0x88))
#define HIGH_HALVES(A, B) _mm256_castps_si256(_mm256_shuffle_ps(_mm256_castsi256_ps(A), _mm256_castsi256_ps(B), 0xdd))
/* 32-bit values' offsets: eight bytes from byte AT8 of BASE in each lane
 * (up to 7 + 32 bits), shifted right by BIT as 64-bit items, their low
 * halves in lane order; MASK as GATHER_PAIRS_MASKED's. */
#define OFFSETS32(OUT, BASE, AT8, BIT, MASK) { \
    __m256i oa_, ob_, bq_ = _mm256_permutevar8x32_epi32((BIT), PAIR_ORDER); \
    GATHER_PAIRS_MASKED(oa_, ob_, BASE, AT8, 1, MASK); \
    oa_ = _mm256_srlv_epi64(oa_, _mm256_cvtepu32_epi64(_mm256_castsi256_si128(bq_))); \
    ob_ = _mm256_srlv_epi64(ob_, _mm256_cvtepu32_epi64(_mm256_extracti128_si256(bq_, 1))); \
    OUT = LOW_HALVES(oa_, ob_); \
}
/* Eight lanes' offsets without a gather: a half's four offsets of at most
 * 16 bits (27 with `five`) lie in the 16 bytes from its first one's byte,
 * each within the 4 bytes (5) from its own. `first_lo`, `first_hi`: where
 * lanes 0 and 4 start (16 readable bytes each); `at8`: each lane's byte,
 * at any common origin; `bit`: its bit in that byte. Two loads and one
 * byte shuffle (two) instead of an 8-lane gather: AMD's Zen 3 (AVX2 only),
 * one thread, best of 9 interleaved with the gathers, ns a value of 2^22
 * values of the middle of real weights in one wide block: 16-bit
 * 1.67-1.77 -> 1.46-1.56 (astra, nomic, gemma, minilm), bytes 1.65-1.69
 * -> 1.46-1.49, 23-bit mantissas 2.04-2.17 -> 1.51-1.71. */
__attribute__((target("avx2"), always_inline))
static inline __m256i offsets_in_halves(const uint8_t *first_lo, const uint8_t *first_hi, __m256i at8, __m256i bit,
                                        int five) {
    const __m256i firsts = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);  /* each half's first lane */
    const __m256i spread4 = _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12,
                                             0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12);
    __m256i bytes = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)first_lo)),
                                            _mm_loadu_si128((const __m128i *)first_hi), 1);
    __m256i rel = _mm256_sub_epi32(at8, _mm256_permutevar8x32_epi32(at8, firsts));
    __m256i idx = _mm256_add_epi8(_mm256_shuffle_epi8(rel, spread4), _mm256_set1_epi32(0x03020100));
    __m256i got = _mm256_srlv_epi32(_mm256_shuffle_epi8(bytes, idx), bit);
    if (five)  /* up to 7 + 27 bits: the fifth byte's bits above the four's */
        got = _mm256_or_si256(got, _mm256_sllv_epi32(
            _mm256_shuffle_epi8(bytes, _mm256_add_epi32(rel, _mm256_set1_epi32((int)0x80808004))),
            _mm256_sub_epi32(_mm256_set1_epi32(32), bit)));
    return got;
}
#define WIDE_PARAMS const uint64_t *etab, const uint32_t *wtab, uint32_t *xs, const uint8_t *words, uint64_t wsafe, \
                    uint64_t wlimit, uint64_t *wat, const uint8_t *offs, uint64_t osafe, uint64_t olimit, \
                    uint64_t *opos, Py_ssize_t groups, Py_ssize_t *done, int P, int width, uint8_t *out
#define WIDE_ARGS etab, wtab, xs, words, wsafe, wlimit, wat, offs, osafe, olimit, opos, groups, done, P, width, out
__attribute__((target("avx2"), always_inline))
static inline int wide_body(WIDE_PARAMS, int near, int gathers) {
    __m256i x[4];
    for (int g = 0; g < 4; g++) x[g] = _mm256_loadu_si256((const __m256i *)(xs + 8 * g));
    const __m256i mask = _mm256_set1_epi32((int)((1u << P) - 1)), lo16 = _mm256_set1_epi32(0xffff);
    const __m256i below = _mm256_set1_epi32(RANS_L - 1), one = _mm256_set1_epi32(1), seven = _mm256_set1_epi32(7);
    const __m256i low6 = _mm256_set1_epi32(63);
    const __m128i shift = _mm_cvtsi32_si128(P);
    uint64_t at = *wat;
    uint32_t pos = (uint32_t)*opos;
    int bad = 0;
    Py_ssize_t grp = 0;
    for (; grp < groups && at <= wsafe && pos <= osafe; grp++) {
        __m256i v[4], r[4], wd[4];
        for (int g = 0; g < 4; g++) {
            __m256i slot = _mm256_and_si256(x[g], mask), ea, eb;
            if (gathers) GATHER_PAIRS(ea, eb, etab, slot, 8)
            else LOAD_PAIRS(ea, eb, etab, slot)
            __m256i e = LOW_HALVES(ea, eb);
            v[g] = HIGH_HALVES(ea, eb);
            if (width != 4) wd[g] = _mm256_srli_epi32(v[g], 16);
            else if (wtab) wd[g] = _mm256_i32gather_epi32((const int *)wtab, slot, 4);
            else {  /* the width in the low 6 bits of the lower value, which are zero */
                wd[g] = _mm256_and_si256(v[g], low6);
                v[g] = _mm256_andnot_si256(low6, v[g]);
            }
            x[g] = _mm256_add_epi32(_mm256_mullo_epi32(_mm256_and_si256(e, lo16), _mm256_srl_epi32(x[g], shift)),
                                    _mm256_srli_epi32(e, 16));
        }
        for (int g = 0; g < 4; g++) {
            __m256i need = _mm256_cmpeq_epi32(_mm256_min_epu32(x[g], below), x[g]);
            unsigned m = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(need));
            __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(words + at)));
            w = _mm256_permutevar8x32_epi32(w, _mm256_loadu_si256((const __m256i *)wide_perm[m]));
            x[g] = _mm256_blendv_epi8(x[g], _mm256_or_si256(_mm256_slli_epi32(x[g], 16), w), need);
            at += 2 * (uint64_t)__builtin_popcount(m);
        }
        for (int g = 0; g < 4; g++) {
            __m256i t = _mm256_add_epi32(wd[g], _mm256_slli_si256(wd[g], 4));
            t = _mm256_add_epi32(t, _mm256_slli_si256(t, 8));
            __m256i carry = _mm256_shuffle_epi32(t, 0xff);
            t = _mm256_add_epi32(t, _mm256_permute2x128_si256(carry, carry, 0x08));  /* inclusive prefix sum */
            __m256i p = _mm256_add_epi32(_mm256_set1_epi32((int)pos), _mm256_sub_epi32(t, wd[g]));
            __m256i at8 = _mm256_srli_epi32(p, 3), bit = _mm256_and_si256(p, seven);
            /* a width of 32 shifts the mask's 1 out: all ones, as it should */
            __m256i keep = _mm256_sub_epi32(_mm256_sllv_epi32(one, wd[g]), one);
            if (width == 4 && !near) {
                __m256i got;
                OFFSETS32(got, offs, at8, bit, _mm256_set1_epi64x(-1));
                r[g] = _mm256_add_epi32(v[g], _mm256_and_si256(got, keep));
            } else {
                /* (32-bit values: `near`, offsets at most 27 bits wide) */
                __m256i got = offsets_in_halves(offs + (pos >> 3), offs + (uint32_t)_mm256_extract_epi32(at8, 4), at8,
                                                bit, width == 4);
                r[g] = _mm256_add_epi32(width == 4 ? v[g] : _mm256_and_si256(v[g], lo16), _mm256_and_si256(got, keep));
            }
            pos += (uint32_t)_mm256_extract_epi32(t, 7);
        }
        if (width == 4) {
            for (int g = 0; g < 4; g++) _mm256_storeu_si256((__m256i *)(out + 128 * grp + 32 * g), r[g]);
            if (at > wlimit || pos > olimit) { bad = 1; grp++; break; }
            continue;
        }
        __m256i a = _mm256_packus_epi32(r[0], r[1]), b = _mm256_packus_epi32(r[2], r[3]);
        if (width == 1) {
            __m256i c = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(a, b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(out + 32 * grp), c);
        } else {
            _mm256_storeu_si256((__m256i *)(out + 64 * grp), _mm256_permute4x64_epi64(a, 0xd8));
            _mm256_storeu_si256((__m256i *)(out + 64 * grp + 32), _mm256_permute4x64_epi64(b, 0xd8));
        }
        if (at > wlimit || pos > olimit) { bad = 1; grp++; break; }
    }
    for (int g = 0; g < 4; g++) _mm256_storeu_si256((__m256i *)(xs + 8 * g), x[g]);
    *wat = at;
    *opos = pos;
    *done = grp;
    return bad;
}

/* The kernel twice: for AVX2, and for CPUs with AVX-512 (F, VL, BW, DQ),
 * where the same steps get 32 vector registers instead of 16 (the kernel
 * holds 16 vectors and its constants: fewer spills) and EVEX forms: warm
 * one-thread unpack on the AMD EPYC (Zen 4) nomic 240-247 -> 228-235 ms,
 * astra 219-224 -> 208-212, minilm 66.1-66.3 -> 63.0-64.5 (best of six,
 * interleaved). The same values either way (the tests run both). */
__attribute__((target("avx2")))
static int wide_avx2(WIDE_PARAMS) { return wide_body(WIDE_ARGS, 0, 0); }
__attribute__((target("avx2,avx512f,avx512vl,avx512bw,avx512dq")))
static int wide_avx512(WIDE_PARAMS) { return wide_body(WIDE_ARGS, 0, 1); }
/* 32-bit values whose offsets are at most NEAR_AVX2_BITS wide: read as
 * those of 8 and 16-bit values are, and a fifth byte (7 + 27 bits in a
 * lane's 5 bytes, a half's four within 16 bytes), not gathered. */
#define NEAR_AVX2_BITS 27
__attribute__((target("avx2")))
static int wide_avx2_near(WIDE_PARAMS) { return wide_body(WIDE_ARGS, 1, 0); }
__attribute__((target("avx2,avx512f,avx512vl,avx512bw,avx512dq")))
static int wide_avx512_near(WIDE_PARAMS) { return wide_body(WIDE_ARGS, 1, 1); }

/* The same steps on 512-bit vectors, for CPUs with AVX-512 VBMI2 as well:
 * two vectors of sixteen states instead of four of eight (half the
 * instructions, each gather taking twice the items), and a vector's words
 * placed by one expand (VBMI2) of the next sixteen into the lanes that
 * renormalize, in lane order as wide_perm places them (the register form:
 * AMD's Zen 4 runs the memory forms of compress and expand slowly). A
 * vector's offsets are taken from the 64 bytes at its first one's byte by
 * byte permutes (VBMI; a funnel shift of two for 32-bit values) instead of
 * a gather, where they lie inside them: always for 8 and 16-bit values,
 * for 32-bit ones up to NEAR_BITS wide. A slot's entry is gathered as two
 * 32-bit halves (scale 8), not as 64-bit items split by two permutes, the
 * offsets' bytes placed from pos's byte, and v's bits above a narrow value
 * left for the narrowing store to cut: 0.96 of the time before, the mean of
 * 18 comparisons (astra's and nomic's 16-bit values and bytes, minilm's F32
 * and its 23-bit mantissas; builds interleaved, one thread, best of 40-80
 * each; 0.91-1.03, the host's noise), where the other steps alone gained
 * nothing. A group reads at most 64 bytes of
 * words past its start, and of offsets 128 where it permutes (136 where it
 * gathers, as wide_body): inside WIDE_READS.
 * The same values as wide_body (the tests run both). */
#if (defined(__clang__) && __clang_major__ >= 7) || (!defined(__clang__) && __GNUC__ >= 8)  /* VBMI2's intrinsics */
#define HAVE_WIDE_ZMM 1
#define ZMM_TARGET __attribute__((target("avx2,avx512f,avx512vl,avx512bw,avx512dq,avx512vbmi,avx512vbmi2,popcnt")))
/* A wide block of at most SMALL_BINS bins (of 32-bit values, offsets of at
 * most NEAR_BITS): its model in registers, for lookups by permutes instead
 * of two gathers of etab (small_model; no etab is built). A slot's bin:
 * the bin of its bucket's first slot (`starts`, by the top 6 or 7 bits of
 * the slot: one permute of one vector or of two), moved on past a bin that
 * starts above it in the bucket where its bucket holds such a start
 * (`steps`: 0 or 1, a kernel each); a block whose buckets hold more keeps
 * to the gathers: each step more, a permute, a compare and an add on the
 * chain from state to state, made two steps' blocks 0.97-1.18 of the
 * gathers' time and three steps' 1.18. `next` is each bin's end (the next
 * one's cum; 2^P for the last), `value` its lower value | offset width <<
 * 16 (32-bit values: the lower value, the width in `widths`); where no bin
 * has offset bits the offsets' steps are left out (`offsets` 0). Streams
 * of 2^20 values, warm, one thread, best of 40 each taking turns with the
 * gathers' build (2026-12-07, the Intel Xeon): 16 bell-shaped nibbles
 * 0.713 -> 0.563 ns a value, 15 exponent-like bytes 0.716 -> 0.589,
 * uniform bytes (a few bins with offset bits) 0.756 -> 0.551, four 16-bit
 * values 0.719 -> 0.562; 31 exponent-like bytes and a 16-bit normal spread
 * (more bins, or more steps: the gathers) unchanged. Of the corpus's wide
 * values it codes 28 % of gemma3's (its nibbles: most of its bytes have
 * 64-74 bins), 4 % of astra's, 2 % of piper's; gemma3's one-shot unpack at
 * 2 threads took 0.90 of the time (means of 12 fresh processes taking
 * turns; medians 0.93). 32-bit values (e.g. F32 with 15 exponents and
 * 23-bit mantissas) 0.798 -> 0.740, nine values with 20 offset bits 0.786
 * -> 0.690, four without 0.775 -> 0.577; such models code 28 % of ppocr's
 * wide values, 10 % of resemblyzer's, 7 % of piper's: their unpack 0.963,
 * 0.969 and 0.964 of the time (means of 12, taking turns). Tried and
 * dropped: one gather of a 32-bit entry (frequency, bias, bin) and the
 * bin's value by permutes, for models of up to 64 or 128 bins at P <= 12
 * (most of the corpus's): 1.01-1.09 of the time. */
#define SMALL_BINS 32
#define SMALL_STEPS 1
typedef struct {
    uint32_t freq[SMALL_BINS], cum[SMALL_BINS], next[SMALL_BINS], value[SMALL_BINS];
    uint32_t widths[SMALL_BINS];  /* 32-bit values': their offsets' widths (`value` the lower value alone) */
    uint8_t starts[128];
    int log, shift, steps, widest;  /* 2^log buckets of 2^shift slots; the widest offsets */
} small_t;

ZMM_TARGET __attribute__((always_inline))
static inline int wide_zmm_body(WIDE_PARAMS, int near, const small_t *sm, int offsets, int fixed_steps) {
    __m512i x[2];
    for (int g = 0; g < 2; g++) x[g] = _mm512_loadu_si512((const void *)(xs + 16 * g));
    const __m512i mask = _mm512_set1_epi32((int)((1u << P) - 1)), lo16 = _mm512_set1_epi32(0xffff);
    const __m512i low = _mm512_set1_epi32(RANS_L), one = _mm512_set1_epi32(1), seven = _mm512_set1_epi32(7);
    const __m512i low6 = _mm512_set1_epi32(63), zero = _mm512_setzero_si512();
    /* the low 32-bit halves of two vectors of eight 64-bit items, in lane order */
    const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    /* a lane's byte index in all four of its bytes, plus 0, 1, 2, 3: the bytes of its offset's item */
    const __m512i spread = _mm512_set4_epi32(0x0c0c0c0c, 0x08080808, 0x04040404, 0x00000000);
    const __m512i bytes4 = _mm512_set1_epi32(0x03020100), four4 = _mm512_set1_epi32(0x04040404);
    const __m512i shift = _mm512_set1_epi32(P);
    uint64_t at = *wat;
    uint32_t pos = (uint32_t)*opos;
    int bad = 0;
    Py_ssize_t grp = 0;
    /* the small model's tables (sm): two vectors each, for two-vector permutes */
    __m512i freq[2], cum[2], next[2], value[2], widths[2] = {zero, zero}, starts[2] = {zero, zero};
    __m128i bshift = _mm_setzero_si128();
    int steps = 0, wide_starts = 0;
    if (sm) {
        for (int h = 0; h < 2; h++) {
            freq[h] = _mm512_loadu_si512((const void *)(sm->freq + 16 * h));
            cum[h] = _mm512_loadu_si512((const void *)(sm->cum + 16 * h));
            next[h] = _mm512_loadu_si512((const void *)(sm->next + 16 * h));
            value[h] = _mm512_loadu_si512((const void *)(sm->value + 16 * h));
            if (width == 4) widths[h] = _mm512_loadu_si512((const void *)(sm->widths + 16 * h));
        }
        starts[0] = _mm512_loadu_si512((const void *)sm->starts);
        starts[1] = _mm512_loadu_si512((const void *)(sm->starts + 64));
        bshift = _mm_cvtsi32_si128(sm->shift);
        steps = fixed_steps;
        wide_starts = sm->log == 7;
    }
    const __m512i low8 = _mm512_set1_epi32(0xff);
    for (; grp < groups && at <= wsafe && pos <= osafe; grp++) {
        __m512i v[2], r[2], wd[2];
        for (int g = 0; g < 2; g++) {
            __m512i slot = _mm512_and_si512(x[g], mask);
            if (sm) {  /* the slot's bin by permutes: its bucket's first bin, moved on past the bins starting after it */
                __m512i bucket = _mm512_srl_epi32(slot, bshift);
                __m512i bin = _mm512_and_si512(wide_starts ? _mm512_permutex2var_epi8(starts[0], bucket, starts[1])
                                                           : _mm512_permutexvar_epi8(bucket, starts[0]), low8);
                for (int k = 0; k < SMALL_STEPS && k < steps; k++) {
                    __mmask16 past = _mm512_cmpge_epu32_mask(slot, _mm512_permutex2var_epi32(next[0], bin, next[1]));
                    bin = _mm512_mask_add_epi32(bin, past, bin, one);
                }
                v[g] = _mm512_permutex2var_epi32(value[0], bin, value[1]);
                wd[g] = width == 4 ? _mm512_permutex2var_epi32(widths[0], bin, widths[1]) : _mm512_srli_epi32(v[g], 16);
                x[g] = _mm512_add_epi32(_mm512_mullo_epi32(_mm512_permutex2var_epi32(freq[0], bin, freq[1]),
                                                           _mm512_srlv_epi32(x[g], shift)),
                                        _mm512_sub_epi32(slot, _mm512_permutex2var_epi32(cum[0], bin, cum[1])));
                continue;
            }
            /* a slot's two halves, sixteen at a time (scale 8): no permutes after two 64-bit gathers */
            __m512i e = _mm512_i32gather_epi32(slot, (const void *)etab, 8);
            v[g] = _mm512_i32gather_epi32(slot, (const void *)((const uint8_t *)etab + 4), 8);
            if (width != 4) wd[g] = _mm512_srli_epi32(v[g], 16);
            else if (wtab) wd[g] = _mm512_i32gather_epi32(slot, (const void *)wtab, 4);
            else {  /* the width in the low 6 bits of the lower value, which are zero */
                wd[g] = _mm512_and_si512(v[g], low6);
                v[g] = _mm512_andnot_si512(low6, v[g]);
            }
            x[g] = _mm512_add_epi32(_mm512_mullo_epi32(_mm512_and_si512(e, lo16), _mm512_srlv_epi32(x[g], shift)),
                                    _mm512_srli_epi32(e, 16));
        }
        for (int g = 0; g < 2; g++) {
            __mmask16 m = _mm512_cmplt_epu32_mask(x[g], low);
            __m256i next = _mm256_loadu_si256((const __m256i *)(words + at));  /* 16 words: the most it takes */
            __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_expand_epi16(m, next));
            x[g] = _mm512_mask_or_epi32(x[g], m, _mm512_slli_epi32(x[g], 16), w);
            at += 2 * (uint64_t)__builtin_popcount((unsigned)m);
        }
        for (int g = 0; g < 2 && !offsets; g++) r[g] = v[g];  /* no bin has offset bits: the lower values */
        for (int g = 0; g < 2 && offsets; g++) {
            __m512i t = _mm512_add_epi32(wd[g], _mm512_alignr_epi32(wd[g], zero, 15));  /* inclusive prefix sum */
            t = _mm512_add_epi32(t, _mm512_alignr_epi32(t, zero, 14));
            t = _mm512_add_epi32(t, _mm512_alignr_epi32(t, zero, 12));
            t = _mm512_add_epi32(t, _mm512_alignr_epi32(t, zero, 8));
            /* each lane's bit from the byte at pos / 8: its byte from there (rel) and bit in it */
            uint32_t first = pos >> 3;
            __m512i p = _mm512_add_epi32(_mm512_set1_epi32((int)(pos & 7)), _mm512_sub_epi32(t, wd[g]));
            __m512i rel = _mm512_srli_epi32(p, 3), bit = _mm512_and_si512(p, seven);
            __m512i bytes = _mm512_loadu_si512((const void *)(offs + first));
            /* a width of 32 shifts the mask's 1 out: all ones, as it should */
            __m512i keep = _mm512_sub_epi32(_mm512_sllv_epi32(one, wd[g]), one);
            if (width == 4) {  /* up to 7 + 32 bits from each lane's byte */
                __m512i got;
                if (near) {  /* each lane's eight bytes inside those 64: two permutes, a funnel shift (VBMI2) */
                    __m512i idx = _mm512_add_epi32(_mm512_shuffle_epi8(rel, spread), bytes4);
                    __m512i lo = _mm512_permutexvar_epi8(idx, bytes);
                    __m512i hi = _mm512_permutexvar_epi8(_mm512_add_epi32(idx, four4), bytes);
                    got = _mm512_shrdv_epi32(lo, hi, bit);
                } else {  /* wider offsets: 64-bit items gathered */
                    __m512i at8 = _mm512_add_epi32(rel, _mm512_set1_epi32((int)first));
                    __m512i oa = _mm512_i32gather_epi64(_mm512_castsi512_si256(at8), (const void *)offs, 1);
                    __m512i ob = _mm512_i32gather_epi64(_mm512_extracti64x4_epi64(at8, 1), (const void *)offs, 1);
                    oa = _mm512_srlv_epi64(oa, _mm512_cvtepu32_epi64(_mm512_castsi512_si256(bit)));
                    ob = _mm512_srlv_epi64(ob, _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(bit, 1)));
                    got = _mm512_permutex2var_epi32(oa, evens, ob);
                }
                r[g] = _mm512_add_epi32(v[g], _mm512_and_si512(got, keep));
            } else {  /* 16 lanes of up to 16 bits: inside the 64 bytes from the first lane's byte */
                __m512i idx = _mm512_add_epi32(_mm512_shuffle_epi8(rel, spread), bytes4);
                __m512i got = _mm512_srlv_epi32(_mm512_permutexvar_epi8(idx, bytes), bit);
                /* v's bits above 16 (the width) are cut off by the narrowing store */
                r[g] = _mm512_add_epi32(v[g], _mm512_and_si512(got, keep));
            }
            pos += (uint32_t)_mm_extract_epi32(_mm512_extracti32x4_epi32(t, 3), 3);
        }
        if (width == 4) {
            _mm512_storeu_si512((void *)(out + 128 * grp), r[0]);
            _mm512_storeu_si512((void *)(out + 128 * grp + 64), r[1]);
        } else if (width == 1) {
            _mm_storeu_si128((__m128i *)(out + 32 * grp), _mm512_cvtepi32_epi8(r[0]));
            _mm_storeu_si128((__m128i *)(out + 32 * grp + 16), _mm512_cvtepi32_epi8(r[1]));
        } else {
            _mm256_storeu_si256((__m256i *)(out + 64 * grp), _mm512_cvtepi32_epi16(r[0]));
            _mm256_storeu_si256((__m256i *)(out + 64 * grp + 32), _mm512_cvtepi32_epi16(r[1]));
        }
        if (at > wlimit || pos > olimit) { bad = 1; grp++; break; }
    }
    for (int g = 0; g < 2; g++) _mm512_storeu_si512((void *)(xs + 16 * g), x[g]);
    *wat = at;
    *opos = pos;
    *done = grp;
    return bad;
}
ZMM_TARGET
static int wide_zmm(WIDE_PARAMS) { return wide_zmm_body(WIDE_ARGS, 0, NULL, 1, 0); }
/* 32-bit values whose offsets are at most NEAR_BITS wide: a lane's starts
 * within 7 + 15 * 31 bits of its vector's first byte, so that the five
 * bytes holding its 7 + 31 bits lie inside the 64 from it (the permutes'
 * eighth byte is never used: a funnel shift by 7 or less takes the high
 * item's low byte at most). A bin of 32-bit offsets is the only bin of its
 * block (the trie's root): gathered. Minilm's and easyocr's low 23 bits
 * of F32, 2^21 values: 1.11-1.14 -> 0.92-1.03 ns a value. */
#define NEAR_BITS 31
ZMM_TARGET
static int wide_zmm_near(WIDE_PARAMS) { return wide_zmm_body(WIDE_ARGS, 1, NULL, 1, 0); }
/* A small model's kernels (small_t), three for each number of steps: 8
 * and 16-bit values with offset bits (small), 32-bit ones with offsets of
 * at most NEAR_BITS (near), and values without offset bits (bare: the
 * values are the lower ones). */
#define SMALL_KERNELS(STEPS) \
ZMM_TARGET static int wide_zmm_small##STEPS(WIDE_PARAMS, const small_t *sm) { return wide_zmm_body(WIDE_ARGS, 0, sm, 1, STEPS); } \
ZMM_TARGET static int wide_zmm_near##STEPS(WIDE_PARAMS, const small_t *sm) { return wide_zmm_body(WIDE_ARGS, 1, sm, 1, STEPS); } \
ZMM_TARGET static int wide_zmm_bare##STEPS(WIDE_PARAMS, const small_t *sm) { return wide_zmm_body(WIDE_ARGS, 0, sm, 0, STEPS); }
SMALL_KERNELS(0)
SMALL_KERNELS(1)
#undef SMALL_KERNELS
typedef int (*small_kernel_t)(WIDE_PARAMS, const small_t *);
/* [steps][no bin has offset bits: 0; 8 and 16-bit values: 1; 32-bit ones, offsets of at most NEAR_BITS: 2] */
static const small_kernel_t small_kernels[SMALL_STEPS + 1][3] = {
    {wide_zmm_bare0, wide_zmm_small0, wide_zmm_near0}, {wide_zmm_bare1, wide_zmm_small1, wide_zmm_near1}};

/* A byte's entry of a 256-entry table of bytes (four vectors): two
 * two-vector permutes (VBMI, the index's low 7 bits), the byte's top bit
 * choosing between them. */
ZMM_TARGET static inline __m512i lookup256(__m512i x, const __m512i *t) {
    __m512i lo = _mm512_permutex2var_epi8(t[0], x, t[1]), hi = _mm512_permutex2var_epi8(t[2], x, t[3]);
    return _mm512_mask_blend_epi8(_mm512_movepi8_mask(x), lo, hi);
}

/* encode_body's bins and offsets of 8-bit values (its OFFSETS loop, the
 * same bytes), 64 at a time: each byte's bin, offset width, offset and
 * whether it lies outside its bin from four tables of its 256 values
 * (permutes, not a load a value); the offsets put together in registers,
 * pairs into 16-bit fields, those into 32-bit ones (variable shifts), and
 * the sixteen of those appended to the bit stream as the scalar loop
 * appends each value's. Offsets of a byte are at most 8 bits, so a pair's
 * at most 16 and four values' at most 32: each step fits its lanes.
 * gemma3's Q8_0 quants (2^20 a chunk): the loop took a sixth of
 * compressing the file. */
ZMM_TARGET
static Py_ssize_t offsets_bytes_zmm(const uint8_t *v, Py_ssize_t n, const uint16_t *rank_of, const uint32_t *lower,
                                    const uint8_t *obits, uint16_t *ranks, uint8_t *offs, size_t *noffs_io,
                                    uint64_t *acc_io, int *fill_io, uint64_t *outside_io) {
    uint8_t tab[4][256] __attribute__((aligned(64)));  /* bin, width, offset, outside; by value */
    for (int x = 0; x < 256; x++) {
        uint32_t r = rank_of[x], w = obits[r], off = (uint32_t)x - lower[r];
        tab[0][x] = (uint8_t)r;  /* bins <= 256 for 8-bit values */
        tab[1][x] = (uint8_t)w;
        tab[2][x] = (uint8_t)off;
        tab[3][x] = w > 31 || (off >> w) != 0;
    }
    __m512i t[4][4];
    for (int k = 0; k < 4; k++)
        for (int q = 0; q < 4; q++) t[k][q] = _mm512_load_si512((const void *)(tab[k] + 64 * q));
    const __m512i lo8 = _mm512_set1_epi16(0x00ff), lo16 = _mm512_set1_epi32(0xffff);
    __m512i bad = _mm512_setzero_si512();
    uint64_t acc = *acc_io;
    int fill = *fill_io;
    size_t noffs = *noffs_io;
    uint32_t field[16], width[16];
    Py_ssize_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512i x = _mm512_loadu_si512((const void *)(v + i));
        __m512i r = lookup256(x, t[0]), w = lookup256(x, t[1]), o = lookup256(x, t[2]);
        bad = _mm512_or_si512(bad, lookup256(x, t[3]));
        _mm512_storeu_si512((void *)(ranks + i), _mm512_cvtepu8_epi16(_mm512_castsi512_si256(r)));
        _mm512_storeu_si512((void *)(ranks + i + 32), _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(r, 1)));
        /* value 2j's offset below value 2j+1's in 16 bits, then pairs in 32 */
        __m512i wl = _mm512_and_si512(w, lo8);
        __m512i f = _mm512_or_si512(_mm512_and_si512(o, lo8), _mm512_sllv_epi16(_mm512_srli_epi16(o, 8), wl));
        __m512i fw = _mm512_add_epi16(wl, _mm512_srli_epi16(w, 8));
        __m512i gl = _mm512_and_si512(fw, lo16);
        f = _mm512_or_si512(_mm512_and_si512(f, lo16), _mm512_sllv_epi32(_mm512_srli_epi32(f, 16), gl));
        fw = _mm512_add_epi32(gl, _mm512_srli_epi32(fw, 16));
        _mm512_storeu_si512((void *)field, f);
        _mm512_storeu_si512((void *)width, fw);
        for (int k = 0; k < 16; k++) {  /* fill < 8 before, a field <= 32 bits: within 64 */
            acc |= (uint64_t)field[k] << fill;
            fill += (int)width[k];
            store8(offs + noffs, acc);
            int whole = fill >> 3;
            noffs += (size_t)whole;
            acc >>= 8 * whole;  /* whole <= 4 */
            fill &= 7;
        }
    }
    if (_mm512_test_epi8_mask(bad, bad)) *outside_io |= 1;
    *acc_io = acc;
    *fill_io = fill;
    *noffs_io = noffs;
    return i;
}
#else
static Py_ssize_t offsets_bytes_zmm(const uint8_t *v, Py_ssize_t n, const uint16_t *rank_of, const uint32_t *lower,
                                    const uint8_t *obits, uint16_t *ranks, uint8_t *offs, size_t *noffs,
                                    uint64_t *acc, int *fill, uint64_t *outside) {
    (void)v; (void)n; (void)rank_of; (void)lower; (void)obits; (void)ranks; (void)offs; (void)noffs; (void)acc;
    (void)fill; (void)outside;
    return 0;  /* never called: zmm is set only where the kernel is built */
}
#endif

/* encode_body's wide groups, eight states a vector: the same steps as
 * its ENC, state by state (the tests hold the two to the same bytes).
 * rec[2 * bin]: m | x_max << 32 (x_max < 2^32: a block of two bins or
 * more has every frequency below 2^P); rec[2 * bin + 1]: freq | cum << 16
 * | l << 32 (each below 2^16). The renormalizing states' words go below
 * `ptr` in state order (group 3's above group 2's, as ENC's from state 31
 * down), written as the top of 16 bytes, so that the rest of them lands
 * below, where the next words go (inside the buffer: it holds 2n + 2
 * words, at most one a value written). Wide F16 and F32 blocks of 2^18
 * values: encode_block 5.4 -> 4.2 ns a value. */
static uint8_t wide_pack[256][16];  /* mask m: its states' 16-bit words at the top of 16 bytes, in order */
/* A wide state's coding step on W-bit vectors (256: wide_encode_avx2, 512:
 * wide_encode_zmm), ENC's: q = x / freq as (X + (X * m >> 32)) >> l in 64
 * bits, the even states then the odd ones; then (q << P) + (X - q * freq)
 * + cum into OUT. fc: freq | cum << 16; l: the shift, in each item's high half. */
#define WIDE_ENC_STEP(W, OUT, X, M, L, FC, SHIFT, LOW32, LO16) { \
    __m##W##i even_ = _mm##W##_add_epi64(_mm##W##_and_si##W((X), (LOW32)), \
                                         _mm##W##_srli_epi64(_mm##W##_mul_epu32((X), (M)), 32)); \
    even_ = _mm##W##_srlv_epi64(even_, _mm##W##_and_si##W((L), (LOW32))); \
    __m##W##i xo_ = _mm##W##_srli_epi64((X), 32); \
    __m##W##i odd_ = _mm##W##_add_epi64(xo_, _mm##W##_srli_epi64(_mm##W##_mul_epu32(xo_, _mm##W##_srli_epi64((M), 32)), 32)); \
    odd_ = _mm##W##_srlv_epi64(odd_, _mm##W##_srli_epi64((L), 32)); \
    __m##W##i q_ = _mm##W##_or_si##W(_mm##W##_and_si##W(even_, (LOW32)), _mm##W##_slli_epi64(odd_, 32)); \
    __m##W##i rest_ = _mm##W##_sub_epi32((X), _mm##W##_mullo_epi32(q_, _mm##W##_and_si##W((FC), (LO16)))); \
    OUT = _mm##W##_add_epi32(_mm##W##_add_epi32(_mm##W##_sll_epi32(q_, (SHIFT)), rest_), _mm##W##_srli_epi32((FC), 16)); \
}

/* `packed` (P <= PACKED_MAX_P: frequencies and cumulative frequencies
 * below 2^12, shifts of at most 12): one record a bin, m | freq << 32 |
 * cum << 45 | l << 57, one pair of gathers a vector instead of two, the
 * fields taken apart in registers and x_max made as freq << (32 - P).
 * AMD's Zen 3, coder_kernels' encode_block against two records a bin,
 * four rounds interleaved, ns a value: astra's bytes 2.94-2.98 ->
 * 2.71-2.80, its 16-bit values 3.62-3.64 -> 3.49-3.54, its 23-bit fields
 * 6.96-7.00 -> 6.69-6.76; gemma3's bytes 2.99-3.22 -> 2.70-2.78. */
__attribute__((target("avx2"), always_inline))
static inline uint16_t *wide_encode_body(const uint64_t *rec, const uint16_t *ranks, Py_ssize_t whole, uint32_t *xs,
                                         uint16_t *ptr, int P, int packed) {
    __m256i x[4];
    for (int g = 0; g < 4; g++) x[g] = _mm256_loadu_si256((const __m256i *)(xs + 8 * g));
    const __m256i low32 = _mm256_set1_epi64x(0xffffffff), lo16 = _mm256_set1_epi32(0xffff);
    const __m256i f13 = _mm256_set1_epi32(0x1fff), c12 = _mm256_set1_epi32(0xfff);
    const __m128i shift = _mm_cvtsi32_si128(P), up = _mm_cvtsi32_si128(32 - P);
    for (Py_ssize_t i = whole - WIDE_LANES; i >= 0; i -= WIDE_LANES) {
        for (int g = 3; g >= 0; g--) {
            __m256i a, b, m, x_max, fc, l;
            if (packed) {  /* the eight records by scalar loads (LOAD_PAIRS_AT: coder_kernels' encode_block on
                            * the AMD EPYC, Zen 3, ns a value, gathers -> loads: nomic 16-bit 3.83-3.99 -> 3.32-3.39,
                            * bytes 2.65-3.01 -> 2.16-2.17, astra 16-bit 3.38-3.41 -> 2.88-2.90; for two records a bin,
                            * below, the loads were no faster) */
                LOAD_PAIRS_AT(a, b, rec, ranks + i + 8 * g)
                m = LOW_HALVES(a, b);
                __m256i hi = HIGH_HALVES(a, b), freq = _mm256_and_si256(hi, f13);
                l = _mm256_srli_epi32(hi, 25);
                fc = _mm256_or_si256(freq, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(hi, 13), c12), 16));
                x_max = _mm256_sll_epi32(freq, up);
            } else {
                __m256i c, d;
                __m256i idx = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(ranks + i + 8 * g))), 1);
                GATHER_PAIRS(a, b, rec, idx, 8);
                GATHER_PAIRS(c, d, rec + 1, idx, 8);
                m = LOW_HALVES(a, b), x_max = HIGH_HALVES(a, b), fc = LOW_HALVES(c, d), l = HIGH_HALVES(c, d);
            }
            __m256i X = x[g];
            __m256i need = _mm256_cmpeq_epi32(_mm256_max_epu32(X, x_max), X);
            unsigned mask = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(need));
            __m128i words = _mm256_castsi256_si128(_mm256_permute4x64_epi64(
                _mm256_packus_epi32(_mm256_and_si256(X, lo16), _mm256_setzero_si256()), 0x08));
            _mm_storeu_si128((__m128i *)(ptr - 8), _mm_shuffle_epi8(words, _mm_loadu_si128((const __m128i *)wide_pack[mask])));
            ptr -= __builtin_popcount(mask);
            X = _mm256_blendv_epi8(X, _mm256_srli_epi32(X, 16), need);
            WIDE_ENC_STEP(256, x[g], X, m, l, fc, shift, low32, lo16)
        }
    }
    for (int g = 0; g < 4; g++) _mm256_storeu_si256((__m256i *)(xs + 8 * g), x[g]);
    return ptr;
}
__attribute__((target("avx2")))
static uint16_t *wide_encode_avx2(const uint64_t *rec, const uint16_t *ranks, Py_ssize_t whole, uint32_t *xs,
                                  uint16_t *ptr, int P) {
    return wide_encode_body(rec, ranks, whole, xs, ptr, P, 0);
}
__attribute__((target("avx2")))
static uint16_t *wide_encode_avx2_packed(const uint64_t *rec, const uint16_t *ranks, Py_ssize_t whole, uint32_t *xs,
                                         uint16_t *ptr, int P) {
    return wide_encode_body(rec, ranks, whole, xs, ptr, P, 1);
}
#else
static uint16_t *wide_encode_avx2(const uint64_t *rec, const uint16_t *ranks, Py_ssize_t whole, uint32_t *xs,
                                  uint16_t *ptr, int P) {
    (void)rec; (void)ranks; (void)whole; (void)xs; (void)P;
    return ptr;  /* never called: wide_simd_usable() is 0 */
}
static uint16_t *wide_encode_avx2_packed(const uint64_t *rec, const uint16_t *ranks, Py_ssize_t whole, uint32_t *xs,
                                         uint16_t *ptr, int P) {
    (void)rec; (void)ranks; (void)whole; (void)xs; (void)P;
    return ptr;  /* never called: wide_simd_usable() is 0 */
}
#endif

#ifdef HAVE_WIDE_ZMM
/* wide_encode_avx2's steps on 512-bit vectors (where wide_zmm runs): two
 * vectors of sixteen states instead of four of eight, each gather taking
 * eight bins' records in lane order, and a vector's renormalizing words
 * compressed (VBMI2) and expanded to the top of 32 bytes, stored below
 * `ptr` as the AVX2 kernel stores 16 (the buffer's 2n + 2 words leave
 * room: a whole group writes at most 32 of them). The same words and
 * states (the tests hold both to the scalar loop's bytes). */
ZMM_TARGET __attribute__((always_inline))
static inline uint16_t *wide_encode_zmm_body(const uint64_t *rec, const uint32_t *small, const uint32_t *paired,
                                             const uint16_t *ranks, Py_ssize_t whole, uint32_t *xs, uint16_t *ptr,
                                             int P) {
    __m512i x[2];
    for (int g = 0; g < 2; g++) x[g] = _mm512_loadu_si512((const void *)(xs + 16 * g));
    const __m512i low32 = _mm512_set1_epi64(0xffffffff), lo16 = _mm512_set1_epi32(0xffff);
    const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odds = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    const __m128i shift = _mm_cvtsi32_si128(P);
    __m512i field[4][2];  /* a small model's m, x_max, fc and l: two vectors each, for two-vector permutes */
    for (int k = 0; small && k < 4; k++)
        for (int h = 0; h < 2; h++) field[k][h] = _mm512_loadu_si512((const void *)(small + SMALL_ENC_BINS * k + 16 * h));
    __m512i two[2][4];  /* a paired model's m and packed fields: four vectors each */
    for (int k = 0; paired && k < 2; k++)
        for (int h = 0; h < 4; h++) two[k][h] = _mm512_loadu_si512((const void *)(paired + PAIRED_ENC_BINS * k + 16 * h));
    const __m512i f13 = _mm512_set1_epi32(0x1fff), c12 = _mm512_set1_epi32(0xfff), b32 = _mm512_set1_epi32(32);
    const __m128i up = _mm_cvtsi32_si128(32 - P);
    for (Py_ssize_t i = whole - WIDE_LANES; i >= 0; i -= WIDE_LANES) {
        for (int g = 1; g >= 0; g--) {
            __m512i bin = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(ranks + i + 16 * g)));
            __m512i m, x_max, fc, l;
            if (small) {
                m = _mm512_permutex2var_epi32(field[0][0], bin, field[0][1]);
                x_max = _mm512_permutex2var_epi32(field[1][0], bin, field[1][1]);
                fc = _mm512_permutex2var_epi32(field[2][0], bin, field[2][1]);
                l = _mm512_permutex2var_epi32(field[3][0], bin, field[3][1]);
            } else if (paired) {  /* bins 32 and up from the second pair of vectors; x_max is freq << (32 - P) */
                __mmask16 upper = _mm512_test_epi32_mask(bin, b32);
                m = _mm512_mask_blend_epi32(upper, _mm512_permutex2var_epi32(two[0][0], bin, two[0][1]),
                                            _mm512_permutex2var_epi32(two[0][2], bin, two[0][3]));
                __m512i f = _mm512_mask_blend_epi32(upper, _mm512_permutex2var_epi32(two[1][0], bin, two[1][1]),
                                                    _mm512_permutex2var_epi32(two[1][2], bin, two[1][3]));
                __m512i freq = _mm512_and_si512(f, f13);
                fc = _mm512_or_si512(freq, _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(f, 13), c12), 16));
                l = _mm512_srli_epi32(f, 25);
                x_max = _mm512_sll_epi32(freq, up);
            } else {
                __m512i idx = _mm512_slli_epi32(bin, 1);
                __m256i i0 = _mm512_castsi512_si256(idx), i1 = _mm512_extracti64x4_epi64(idx, 1);
                __m512i a0 = _mm512_i32gather_epi64(i0, (const void *)rec, 8), a1 = _mm512_i32gather_epi64(i1, (const void *)rec, 8);
                __m512i c0 = _mm512_i32gather_epi64(i0, (const void *)(rec + 1), 8);
                __m512i c1 = _mm512_i32gather_epi64(i1, (const void *)(rec + 1), 8);
                m = _mm512_permutex2var_epi32(a0, evens, a1), x_max = _mm512_permutex2var_epi32(a0, odds, a1);
                fc = _mm512_permutex2var_epi32(c0, evens, c1), l = _mm512_permutex2var_epi32(c0, odds, c1);
            }
            __m512i X = x[g];
            __mmask16 need = _mm512_cmpge_epu32_mask(X, x_max);
            int count = __builtin_popcount((unsigned)need);
            __m256i words = _mm256_maskz_compress_epi16(need, _mm512_cvtepi32_epi16(X));
            /* the count words at the top of the 16 (their order kept) */
            words = _mm256_maskz_expand_epi16((__mmask16)(0xffffu << (16 - count)), words);
            _mm256_storeu_si256((__m256i *)(ptr - 16), words);
            ptr -= count;
            X = _mm512_mask_srli_epi32(X, need, X, 16);
            WIDE_ENC_STEP(512, x[g], X, m, l, fc, shift, low32, lo16)
        }
    }
    for (int g = 0; g < 2; g++) _mm512_storeu_si512((void *)(xs + 16 * g), x[g]);
    return ptr;
}
ZMM_TARGET
static uint16_t *wide_encode_zmm(const uint64_t *rec, const uint16_t *ranks, Py_ssize_t whole, uint32_t *xs,
                                 uint16_t *ptr, int P) {
    return wide_encode_zmm_body(rec, NULL, NULL, ranks, whole, xs, ptr, P);
}
/* A block of at most SMALL_ENC_BINS bins (nibbles, an exponent's few
 * values, a sign and a few small ones): a value's four fields by permutes
 * of its bin among two vectors each, as the decoder's small models
 * (small_t) look theirs up, instead of four gathers of eight records.
 * encode_block of 2^19 values, best of 40 taking turns with simd 4 (the
 * gathers), 2026-12-07, the Intel Xeon, ns a value: bell-shaped nibbles
 * 1.65 -> 1.38, 15 exponent-like bytes 1.68 -> 1.38, 31 of them 1.61 ->
 * 1.34, four 16-bit values 2.38 -> 2.08, nine 32-bit ones with 20 offset
 * bits 2.97 -> 2.68. */
ZMM_TARGET
static uint16_t *wide_encode_zmm_small(const uint32_t *small, const uint16_t *ranks, Py_ssize_t whole, uint32_t *xs,
                                       uint16_t *ptr, int P) {
    return wide_encode_zmm_body(NULL, small, NULL, ranks, whole, xs, ptr, P);
}
/* Models of 33 to PAIRED_ENC_BINS bins at P <= PACKED_MAX_P (frequencies
 * and cumulative ones below 2^12, so that three fields pack in a word): m
 * and the packed word, each by two two-vector permutes and a blend on the
 * bin's bit 5. encode_block of 2^19 values against the gathers (simd 4),
 * best of 40 taking turns, ns a value: bytes of 48 and 64 bins 1.62 ->
 * 1.43 and 1.44, sixty 16-bit values 2.32 -> 2.13. Tried and dropped: the
 * same for up to 128 bins (four pairs, three blends a table), which most
 * F16, BF16 and F32 blocks have (65-128 bins: 95 % of astra's 16-bit
 * values, 91 % of nomic's, 80 % of minilm's 32-bit ones): coder_kernels'
 * encode_block on their values 0.98-1.02 of the gathers' time; and models
 * of up to 32 bins packed the same way, 1.02-1.05 of the four tables'. */
ZMM_TARGET
static uint16_t *wide_encode_zmm_paired(const uint32_t *paired, const uint16_t *ranks, Py_ssize_t whole, uint32_t *xs,
                                        uint16_t *ptr, int P) {
    return wide_encode_zmm_body(NULL, NULL, paired, ranks, whole, xs, ptr, P);
}
#else
static uint16_t *wide_encode_zmm(const uint64_t *rec, const uint16_t *ranks, Py_ssize_t whole, uint32_t *xs,
                                 uint16_t *ptr, int P) {
    (void)rec; (void)ranks; (void)whole; (void)xs; (void)P;
    return ptr;  /* never called: wide_zmm is set only where the kernel is built */
}
static uint16_t *wide_encode_zmm_small(const uint32_t *small, const uint16_t *ranks, Py_ssize_t whole, uint32_t *xs,
                                       uint16_t *ptr, int P) {
    (void)small; (void)ranks; (void)whole; (void)xs; (void)P;
    return ptr;  /* never called: small_zmm is set only where the kernel is built */
}
static uint16_t *wide_encode_zmm_paired(const uint32_t *paired, const uint16_t *ranks, Py_ssize_t whole, uint32_t *xs,
                                        uint16_t *ptr, int P) {
    (void)paired; (void)ranks; (void)whole; (void)xs; (void)P;
    return ptr;  /* never called: small_zmm is set only where the kernel is built */
}
#endif

/* The kernel's contract one value at a time, for a CPU without AVX2: the
 * 32 states are independent but for the shared word position, so their
 * steps overlap as the vectors' do. The width and lower value of a slot's
 * bin come from its entry's value v (and wtab) as W and LOWER say. */

#define WIDE_SCALAR(NAME, T, W, LOWER) \
static int NAME(const uint64_t *etab, const uint32_t *wtab, uint32_t vmask, uint32_t *x, \
                const uint8_t *words, uint64_t wsafe, uint64_t wlimit, uint64_t *wat, const uint8_t *offs, \
                uint64_t osafe, uint64_t olimit, uint64_t *opos, Py_ssize_t groups, Py_ssize_t *done, int P, T *out) { \
    const uint32_t mask = (1u << P) - 1; \
    uint64_t at = *wat, pos = *opos; \
    int bad = 0; \
    Py_ssize_t grp = 0; \
    (void)wtab; (void)vmask; \
    for (; grp < groups && at <= wsafe && pos <= osafe; grp++, out += WIDE_LANES) { \
        for (int k = 0; k < WIDE_LANES; k++) { \
            uint32_t X = x[k], slot = X & mask, e = (uint32_t)etab[slot], v = (uint32_t)(etab[slot] >> 32), w = (W); \
            X = (e & 0xffff) * (X >> P) + (e >> 16); \
            uint32_t need = X < RANS_L, word = (uint32_t)words[at] | (uint32_t)words[at + 1] << 8; \
            x[k] = (X << (need << 4)) | (word & (0u - need)); \
            at += 2 * need; \
            out[k] = (T)((LOWER) + (uint32_t)((load8(offs + (pos >> 3)) >> (pos & 7)) & (((uint64_t)1 << w) - 1))); \
            pos += w; \
        } \
        if (at > wlimit || pos > olimit) { bad = 1; grp++; break; } \
    } \
    *wat = at; \
    *opos = pos; \
    *done = grp; \
    return bad; \
}
/* fields of at most 16 bits: v is lower | width << 16; wider ones: wtab
 * the width, v the lower value (its low 6 bits the width where vmask drops them) */
WIDE_SCALAR(wide_scalar8, uint8_t, v >> 16, v & 0xffff)
WIDE_SCALAR(wide_scalar16, u16u, v >> 16, v & 0xffff)
WIDE_SCALAR(wide_scalar32, u32u, wtab[slot], v & vmask)
#undef WIDE_SCALAR

#ifdef HAVE_WIDE_AVX2
CPU_HAS(cpu_has_avx2, "avx2")
CPU_HAS(cpu_has_avx512vl, "avx512vl")
CPU_HAS(cpu_has_avx512bw, "avx512bw")
CPU_HAS(cpu_has_avx512dq, "avx512dq")
#endif
#ifdef HAVE_WIDE_ZMM
CPU_HAS(cpu_has_avx512vbmi, "avx512vbmi")
CPU_HAS(cpu_has_avx512vbmi2, "avx512vbmi2")
#endif

/* Whether the AVX2 kernels' AVX-512 builds run (`simd` 1: whatever the
 * CPU has; 3: the AVX-512 builds of the 256-bit kernels, not the 512-bit
 * one; 2: AVX2 alone; the tests hold them all to the same values). */
static int wide_avx512_usable(int simd) {
#ifdef HAVE_WIDE_AVX2
    return (simd == 1 || simd == 3 || simd == 4) && cpu_has_avx512f() && cpu_has_avx512vl() && cpu_has_avx512bw()
           && cpu_has_avx512dq();
#else
    (void)simd;
    return 0;
#endif
}

#ifdef HAVE_WIDE_ZMM
/* Whether the 512-bit wide kernel runs (wide_zmm: `simd` 1, or 4: with
 * its gathers alone, no small model's permutes). */
static int wide_zmm_usable(int simd) {
    return (simd == 1 || simd == 4) && wide_avx512_usable(simd) && cpu_has_avx512vbmi() && cpu_has_avx512vbmi2();
}

/* The first bin of each of 2^log buckets of slots (into `starts`, where
 * given), and the most bins' starts any bucket holds past its first
 * slot's. `slots`: each slot's bin. */
static int small_starts(const uint16_t *slots, uint32_t M, int log, uint8_t *starts) {
    int shift = (1 << log) < (int)M ? __builtin_ctz(M) - log : 0, steps = 0;
    for (uint32_t b = 0; b < (1u << log) && (b << shift) < M; b++) {
        uint32_t first = b << shift, last = first + (1u << shift) - 1;
        if (last >= M) last = M - 1;
        if (starts) starts[b] = (uint8_t)slots[first];
        if (slots[last] - slots[first] > steps) steps = slots[last] - slots[first];
    }
    return steps;
}

/* The small model of a wide block's bins (small_t), where it has at most
 * SMALL_BINS and no bucket of slots holds more than SMALL_STEPS bins' starts
 * past its first slot's bin; 0 where not. */
static int small_model(const uint32_t *freq, const uint32_t *cum, const uint32_t *lower, const uint8_t *obits,
                       Py_ssize_t bins, int P, int width, const uint16_t *slots, small_t *sm) {
    if (bins > SMALL_BINS) return 0;
    uint32_t M = 1u << P;
    memset(sm, 0, sizeof *sm);
    for (Py_ssize_t r = 0; r < bins; r++) {
        sm->freq[r] = freq[r];
        sm->cum[r] = cum[r];
        sm->next[r] = r + 1 < bins ? cum[r + 1] : M;
        sm->value[r] = width == 4 ? lower[r] : lower[r] | (uint32_t)obits[r] << 16;
        sm->widths[r] = obits[r];
        if (obits[r] > sm->widest) sm->widest = obits[r];
    }
    /* 64 buckets (one permute of one vector) unless 128 (of two) save a step */
    int steps64 = small_starts(slots, M, 6, NULL), steps128 = small_starts(slots, M, 7, NULL);
    sm->log = steps128 < steps64 ? 7 : 6;
    sm->steps = small_starts(slots, M, sm->log, sm->starts);
    sm->shift = P > sm->log ? P - sm->log : 0;
    return sm->steps <= SMALL_STEPS && (width != 4 || sm->widest <= NEAR_BITS);
}
#endif

/* Whether the AVX2 kernels run here. */
static int wide_simd_usable(void) {
#ifdef HAVE_WIDE_AVX2
    return cpu_has_avx2();
#else
    return 0;
#endif
}

/* A wide block (as decode_core, whose checks it makes): the AVX2 kernel
 * where it runs and applies, then one value at a time. `simd` 0 forces
 * the scalar loop (the tests hold the two to the same values). */
static const char *decode_wide(const uint8_t *in, Py_ssize_t inlen, const uint8_t *offs, Py_ssize_t offslen,
                               Py_ssize_t n, int width, int bits, const uint32_t *freq, const uint32_t *cum,
                               const uint32_t *lower, const uint8_t *obits, Py_ssize_t bins, int P, void *out,
                               uint16_t *slots, uint64_t *etab, uint32_t *wtab, int simd) {
    const int lanes = WIDE_LANES;
    uint32_t M = 1u << P;
    const char *error = check_model(freq, cum, obits, bins, P, width);
    if (error) return error;
    if (inlen < 4 * lanes || (inlen - 4 * lanes) % 2) return "damaged stream (length)";
    uint32_t most = 0;
    for (Py_ssize_t r = 0; r < bins; r++) {
        for (uint32_t j = 0; j < freq[r]; j++) slots[cum[r] + j] = (uint16_t)r;
        if (freq[r] > most) most = freq[r];
    }
    uint32_t x[WIDE_LANES];
    int bad = 0;
    for (int k = 0; k < lanes; k++) {
        x[k] = (uint32_t)in[4 * k] | (uint32_t)in[4 * k + 1] << 8 | (uint32_t)in[4 * k + 2] << 16 | (uint32_t)in[4 * k + 3] << 24;
        if (x[k] < RANS_L) bad = 1;
    }
    const uint8_t *words = in + 4 * lanes;
    const uint64_t wlen = (uint64_t)(inlen - 4 * lanes), olen = (uint64_t)offslen;
    uint64_t at = 0, pos = 0;  /* bytes of words read, bits of offsets read */
    Py_ssize_t i = 0;
    uint8_t *o8 = out;
    u16u *o16 = out;
    u32u *o32 = out;
    /* Whole groups of 32 values through a kernel (the
     * AVX2 one where offset positions fit its 32-bit lanes), from the
     * streams themselves while a group's reads stay inside them, then from
     * copies of their last bytes with zero padding: nothing is read past a
     * buffer, and no copy of a stream is made. */
    if (!bad && most < 65536 && n >= lanes) {
        /* a field of 22 bits or more: the width in the lower value's low 6 bits (zero) */
        int low_width = width == 4 && bits >= 22;
        int small = 0;
#ifdef HAVE_WIDE_ZMM
        small_t sm;
        /* (simd 1: 4 keeps to the gathers, for the tests to compare) */
        small = simd == 1 && 8 * (olen + WIDE_READS) < ((uint64_t)1 << 31) && wide_zmm_usable(simd)
                && small_model(freq, cum, lower, obits, bins, P, width, slots, &sm);
#endif
        for (Py_ssize_t r = 0, t = 0; r < bins && !small; r++) {  /* (a small model needs no table) */
            uint32_t v = width != 4 ? lower[r] | (uint32_t)obits[r] << 16 : low_width ? lower[r] | obits[r] : lower[r];
            for (uint32_t j = 0; j < freq[r]; j++, t++) {
                etab[t] = (freq[r] | j << 16) | (uint64_t)v << 32;
                if (width == 4) wtab[t] = obits[r];
            }
        }
        uint8_t wtail[2 * WIDE_READS], otail[2 * WIDE_READS];
        int avx2 = 0;
#ifdef HAVE_WIDE_AVX2
        avx2 = simd && 8 * (olen + WIDE_READS) < ((uint64_t)1 << 31) && wide_simd_usable();
        int widest = 0;
        for (Py_ssize_t r = 0; r < bins; r++) if (obits[r] > widest) widest = obits[r];
        int near = width == 4 && widest <= NEAR_AVX2_BITS;
        int (*kernel)(WIDE_PARAMS) = wide_avx512_usable(simd) ? (near ? wide_avx512_near : wide_avx512)
                                                             : (near ? wide_avx2_near : wide_avx2);
#ifdef HAVE_WIDE_ZMM
        if (wide_zmm_usable(simd))
            kernel = width == 4 && widest <= NEAR_BITS ? wide_zmm_near : wide_zmm;
#endif
#endif
        Py_ssize_t groups = n / lanes, done = 0;
        while (!bad && done < groups) {
            /* where this pass reads: each stream itself, or the copy of its
             * last bytes (fewer than WIDE_READS) from the byte it is at; the
             * first group of a pass always starts (no pass is empty) */
            const uint8_t *wb = words, *ob = offs;
            uint64_t wbase = 0, obase = 0, wsafe, wlimit = wlen, osafe, olimit = 8 * olen;
            if (at + WIDE_READS <= wlen) wsafe = wlen - WIDE_READS;
            else {
                wbase = at;
                size_t len = at < wlen ? (size_t)(wlen - at) : 0;
                memcpy(wtail, words + wbase, len); memset(wtail + len, 0, sizeof wtail - len);
                wb = wtail; wsafe = wlimit = len;
            }
            if (pos + 8 * WIDE_READS <= 8 * olen) osafe = 8 * (olen - WIDE_READS);
            else {
                obase = pos >> 3;
                size_t len = obase < olen ? (size_t)(olen - obase) : 0;
                memcpy(otail, offs + obase, len); memset(otail + len, 0, sizeof otail - len);
                ob = otail; osafe = olimit = 8 * (uint64_t)len;
            }
            uint64_t wat = at - wbase, opos = pos - 8 * obase;
            Py_ssize_t did = 0;
#ifdef HAVE_WIDE_ZMM
            if (small)
                bad = small_kernels[sm.steps][!sm.widest ? 0 : width == 4 ? 2 : 1](
                    etab, NULL, x, wb, wsafe, wlimit, &wat, ob, osafe, olimit, &opos, groups - done, &did, P, width,
                    o8 + done * lanes * width, &sm);
            else
#endif
#ifdef HAVE_WIDE_AVX2
            if (avx2)
                bad = kernel(etab, low_width ? NULL : wtab, x, wb, wsafe, wlimit, &wat, ob, osafe, olimit,
                             &opos, groups - done, &did, P, width, o8 + done * lanes * width);
            else
#endif
            if (width == 4) bad = wide_scalar32(etab, wtab, low_width ? ~63u : ~0u, x, wb, wsafe, wlimit,
                                                &wat, ob, osafe, olimit, &opos, groups - done, &did, P,
                                                o32 + done * lanes);
            else if (width == 1) bad = wide_scalar8(etab, NULL, 0, x, wb, wsafe, wlimit, &wat, ob, osafe,
                                                    olimit, &opos, groups - done, &did, P, o8 + done * lanes);
            else bad = wide_scalar16(etab, NULL, 0, x, wb, wsafe, wlimit, &wat, ob, osafe, olimit, &opos,
                                     groups - done, &did, P, o16 + done * lanes);
            at = wbase + wat;
            pos = 8 * obase + opos;
            done += did;
            if (!did) bad = 1;  /* never (see above): no pass may leave it looping */
        }
        i = done * lanes;
    }
    for (; i < n && !bad; i++) {
        uint32_t X = x[i % lanes], slot = X & (M - 1), r = slots[slot];
        X = freq[r] * (X >> P) + slot - cum[r];
        if (X < RANS_L) {
            if (at + 2 > wlen) { bad = 1; break; }
            X = (X << 16) | (uint32_t)words[at] | (uint32_t)words[at + 1] << 8;
            at += 2;
        }
        x[i % lanes] = X;
        uint32_t w = obits[r], v = lower[r];
        if (w) {
            if (pos + w > 8 * olen) { bad = 1; break; }
            v += (uint32_t)((load_bits(offs, olen, pos >> 3) >> (pos & 7)) & (((uint64_t)1 << w) - 1));
            pos += w;
        }
        if (width == 1) o8[i] = (uint8_t)v; else if (width == 2) o16[i] = (uint16_t)v; else o32[i] = v;
    }
    if (!bad) {
        for (int k = 0; k < lanes; k++) if (x[k] != RANS_L) bad = 1;
        /* every word read, every offset byte read, its padding bits zero */
        if (at != wlen || (pos + 7) / 8 != olen || ((pos & 7) && (offs[pos >> 3] >> (pos & 7)))) bad = 1;
    }
    return bad ? "damaged stream" : NULL;
}

/* Eight narrow blocks at once. One narrow block's four states step through
 * the scalar batches above at about 2 ns a value, bound by their
 * instructions (two blocks interleaved in one scalar loop gained 11 %).
 * With AVX2, eight blocks decode together: two to a vector (lanes 0-3 one
 * block's states, 4-7 another's), four vectors in flight so that their
 * table gathers overlap, each half renormalized from its own block's words
 * (the permutation multi_perm[mask] places them) and its offsets read as
 * the wide kernel reads them (a prefix sum of the widths within the half,
 * a gather). A block takes a slot of the engine (multi_t) whatever its
 * length; a call decodes MULTI_GROUPS groups of four values of each; a
 * block with fewer values left, or whose next call could read past what
 * may be read (its stream, narrow_t), is finished alone (narrow_finish,
 * with its checks) and its slot takes the next block. Blocks come from
 * every stream of a decode_streams call (a window of a file's chunks):
 * taesd's narrow F16 blocks 2.03 -> 1.25 ns a value, pocketnet's F32 2.41
 * -> 1.55. Where the 512-bit wide kernel runs, the engine's kernels are
 * 512-bit too (MULTI_ZMM: four blocks to a vector): coder_kernels'
 * decode_streams (streams of 2^15 values, tables built and tails alone
 * included), ns a value: astra 16-bit 2.63-3.10 -> 2.15-2.32, ppocr
 * 4.00-4.05 -> 3.62-3.70; 23-bit taesd 4.07-4.26 -> 3.54-3.68, ppocr
 * 3.33-3.44 -> 2.51-2.81, pocketnet 2.78-2.85 -> 2.16-2.28. Sixteen slots
 * (four vectors) did no better than eight. */
#define MULTI_SLOTS 8
#define MULTI_WORD_READS (8 * MULTI_GROUPS + 8)   /* bytes of words a call may read from a slot's position */
#define MULTI_OFFSET_READS (16 * MULTI_GROUPS + 8)  /* bytes of offsets: four values of <= 32 bits a group, a load of 8 */
#define SLOT_ENTRIES (1 << 15)  /* a slot's table: 2^P entries, P <= 15 */
#define MULTI_MIN (2 * BATCH)   /* the fewest values of a block given a slot */
/* lane k < 4 of mask m takes word popcount(m & ((1 << k) - 1)) of its block, lane k >= 4 word 4 + that of m >> 4 */
static int32_t multi_perm[256][8];
static const uint8_t multi_zeros[16];  /* the offsets a block without them reads */

/* After an engine call: each of `count` blocks' four states and offset
 * position from the kernel's lanes (four a block, in order), where its
 * words got to (wp), and its values advanced by the call's. */
static inline void engine_save(narrow_t *const *s, int count, const uint32_t *lanes, const uint32_t *bits,
                               const uint8_t *const *wp) {
    for (int k = 0; k < count; k++) {
        memcpy(s[k]->x, lanes + 4 * k, 16);
        s[k]->pos = bits[4 * k];
        s[k]->at = (uint64_t)(wp[k] - s[k]->in);
        s[k]->i += 4 * MULTI_GROUPS;
    }
}

#ifdef HAVE_WIDE_AVX2
/* One kernel per width of value (T). Offsets are read at 32-bit
 * distances from `obase`, which every active slot's offsets lie within
 * 2^31 bytes of (multi_add sees to it): those of 8 and 16-bit values, and
 * of 32-bit ones where NEAR (every block's at most NEAR_AVX2_BITS wide),
 * as the 16 bytes from each half's first and a byte shuffle (a slot
 * whose `reads` is 0, idle or without offset bits, reads zeros); other
 * 32-bit values' by gathers, such a slot's lanes masked off. Pocketnet's
 * narrow F32 blocks (offsets 25-27 bits wide), AMD's Zen 3: a whole
 * unpack's decode_streams calls 0.74 of the time of the gathers. */
#define MULTI_KERNEL(NAME, T, NV, NEAR) \
__attribute__((target("avx2"))) \
static void NAME(narrow_t *const *s, const int *reads, const uint64_t *arena, const uint8_t *obase) { \
    __m256i x[NV], mask[NV], P[NV], base[NV], dbase[NV], shift[NV], on64[NV], pos[NV]; \
    const uint8_t *wp[2 * NV]; /* each block's next word */ \
    T *out[2 * NV]; \
    for (int k = 0; k < 2 * NV; k++) { wp[k] = s[k]->in + s[k]->at; out[k] = (T *)s[k]->out + s[k]->i; } \
    for (int v = 0; v < NV; v++) { \
        const narrow_t *a = s[2 * v], *b = s[2 * v + 1]; \
        const int la = reads[2 * v], lb = reads[2 * v + 1]; \
        x[v] = _mm256_setr_epi32((int)a->x[0], (int)a->x[1], (int)a->x[2], (int)a->x[3], \
                                 (int)b->x[0], (int)b->x[1], (int)b->x[2], (int)b->x[3]); \
        mask[v] = _mm256_setr_m128i(_mm_set1_epi32((int)a->f.mask), _mm_set1_epi32((int)b->f.mask)); \
        P[v] = _mm256_setr_m128i(_mm_set1_epi32(a->f.P), _mm_set1_epi32(b->f.P)); \
        base[v] = _mm256_setr_m128i(_mm_set1_epi32((int)(a->f.stab - arena)), _mm_set1_epi32((int)(b->f.stab - arena))); \
        dbase[v] = _mm256_setr_m128i(_mm_set1_epi32(la ? (int)((uintptr_t)a->offs - (uintptr_t)obase) : 0), _mm_set1_epi32(lb ? (int)((uintptr_t)b->offs - (uintptr_t)obase) : 0)); \
        shift[v] = _mm256_setr_m128i(_mm_set1_epi32(a->f.shift), _mm_set1_epi32(b->f.shift)); \
        on64[v] = _mm256_setr_epi64x(la ? -1 : 0, la ? -1 : 0, lb ? -1 : 0, lb ? -1 : 0); /* lanes 0, 1 | 4, 5 and 2, 3 | 6, 7 */ \
        pos[v] = _mm256_setr_m128i(_mm_set1_epi32((int)a->pos), _mm_set1_epi32((int)b->pos)); \
    } \
    const __m256i lo16 = _mm256_set1_epi32(0xffff), below = _mm256_set1_epi32(RANS_L - 1); \
    const __m256i one = _mm256_set1_epi32(1), seven = _mm256_set1_epi32(7); \
    for (int g = 0; g < MULTI_GROUPS; g++) { \
        __m256i h[NV]; \
        for (int v = 0; v < NV; v++) { /* each state's step: its slot's frequency | bias << 16, and its bin */ \
            __m256i slot = _mm256_add_epi32(_mm256_and_si256(x[v], mask[v]), base[v]); \
            __m256i ea, eb; \
            GATHER_PAIRS(ea, eb, arena, slot, 8); \
            __m256i e = LOW_HALVES(ea, eb); \
            h[v] = HIGH_HALVES(ea, eb); \
            x[v] = _mm256_add_epi32(_mm256_mullo_epi32(_mm256_and_si256(e, lo16), _mm256_srlv_epi32(x[v], P[v])), \
                                    _mm256_srli_epi32(e, 16)); \
        } \
        for (int v = 0; v < NV; v++) { /* renormalization: each half from its block's next words, in lane order */ \
            const int a = 2 * v, b = a + 1; \
            __m256i need = _mm256_cmpeq_epi32(_mm256_min_epu32(x[v], below), x[v]); \
            unsigned m = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(need)); \
            __m128i words = _mm_set_epi64x((long long)load8(wp[b]), (long long)load8(wp[a])); \
            __m256i w = _mm256_permutevar8x32_epi32(_mm256_cvtepu16_epi32(words), \
                                                    _mm256_loadu_si256((const __m256i *)multi_perm[m])); \
            x[v] = _mm256_blendv_epi8(x[v], _mm256_or_si256(_mm256_slli_epi32(x[v], 16), w), need); \
            wp[a] += 2 * __builtin_popcount(m & 15); \
            wp[b] += 2 * __builtin_popcount(m >> 4); \
        } \
        for (int v = 0; v < NV; v++) { /* offsets: positions by a prefix sum of the widths within each half */ \
            __m256i wd = _mm256_srli_epi32(h[v], 16), low = _mm256_and_si256(h[v], lo16); \
            if (sizeof(T) == 4) low = _mm256_sllv_epi32(low, shift[v]); \
            __m256i t = _mm256_add_epi32(wd, _mm256_slli_si256(wd, 4)); \
            t = _mm256_add_epi32(t, _mm256_slli_si256(t, 8)); \
            __m256i p = _mm256_add_epi32(pos[v], _mm256_sub_epi32(t, wd)); \
            pos[v] = _mm256_add_epi32(pos[v], _mm256_shuffle_epi32(t, 0xff)); \
            __m256i byte = _mm256_add_epi32(_mm256_srli_epi32(p, 3), dbase[v]), bit = _mm256_and_si256(p, seven); \
            __m256i got; \
            if (sizeof(T) == 4 && !(NEAR)) \
                OFFSETS32(got, obase, byte, bit, on64[v]) \
            else { /* each half's four offsets from the 16 bytes at its first, as wide_body reads them \
                    * (32-bit values: `NEAR`, every block's at most NEAR_AVX2_BITS wide); a half without \
                    * offsets reads zeros */ \
                const uint8_t *qa = reads[2 * v] ? obase + _mm256_extract_epi32(byte, 0) : multi_zeros; \
                const uint8_t *qb = reads[2 * v + 1] ? obase + _mm256_extract_epi32(byte, 4) : multi_zeros; \
                got = offsets_in_halves(qa, qb, byte, bit, sizeof(T) == 4); \
            } \
            /* a width of 32 shifts the mask's 1 out: all ones, as it should */ \
            __m256i keep = _mm256_sub_epi32(_mm256_sllv_epi32(one, wd), one); \
            __m256i r = _mm256_add_epi32(low, _mm256_and_si256(got, keep)); \
            T *oa = out[2 * v] + 4 * g, *ob = out[2 * v + 1] + 4 * g; \
            if (sizeof(T) == 4) { \
                _mm_storeu_si128((__m128i *)oa, _mm256_castsi256_si128(r)); \
                _mm_storeu_si128((__m128i *)ob, _mm256_extracti128_si256(r, 1)); \
            } else if (sizeof(T) == 2) { \
                __m256i q = _mm256_packus_epi32(r, r); \
                _mm_storel_epi64((__m128i *)oa, _mm256_castsi256_si128(q)); \
                _mm_storel_epi64((__m128i *)ob, _mm256_extracti128_si256(q, 1)); \
            } else { \
                __m256i q = _mm256_packus_epi16(_mm256_packus_epi32(r, r), r); \
                uint32_t fa = (uint32_t)_mm_cvtsi128_si32(_mm256_castsi256_si128(q)); \
                uint32_t fb = (uint32_t)_mm_cvtsi128_si32(_mm256_extracti128_si256(q, 1)); \
                memcpy(oa, &fa, 4); memcpy(ob, &fb, 4); \
            } \
        } \
    } \
    uint32_t lanes[8 * NV], bits[8 * NV]; \
    for (int v = 0; v < NV; v++) { \
        _mm256_storeu_si256((__m256i *)(lanes + 8 * v), x[v]); \
        _mm256_storeu_si256((__m256i *)(bits + 8 * v), pos[v]); \
    } \
    engine_save(s, 2 * NV, lanes, bits, wp); \
}
MULTI_KERNEL(multi8_avx2_8, uint8_t, 4, 0)
MULTI_KERNEL(multi8_avx2_16, u16u, 4, 0)
MULTI_KERNEL(multi8_avx2_32, u32u, 4, 0)
MULTI_KERNEL(multi8_avx2_32_near, u32u, 4, 1)
MULTI_KERNEL(multi4_avx2_8, uint8_t, 2, 0)
MULTI_KERNEL(multi4_avx2_16, u16u, 2, 0)
MULTI_KERNEL(multi4_avx2_32, u32u, 2, 0)
MULTI_KERNEL(multi4_avx2_32_near, u32u, 2, 1)
#undef MULTI_KERNEL

#ifdef HAVE_WIDE_ZMM
/* The same steps on 512-bit vectors (where wide_zmm runs): four blocks to
 * a vector (lanes 4j to 4j + 3 block j's states), NV vectors. A block's
 * renormalizing lanes take its next words, placed by a permute whose
 * index is each lane's count of renormalizing lanes before it in its
 * block (prefix sums within 128-bit lanes); offsets as the AVX2 kernel
 * reads them (gathers, an idle slot's lanes masked off). The same values
 * as MULTI_KERNEL (the tests run both). */
#define LANE4(A, B, C, D) _mm512_inserti32x4(_mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(A), (B), 1), \
                                                                  (C), 2), (D), 3)
#define MULTI_ZMM(NAME, T, NV) \
ZMM_TARGET \
static void NAME(narrow_t *const *s, const int *reads, const uint64_t *arena, const uint8_t *obase) { \
    __m512i x[NV], mask[NV], P[NV], base[NV], dbase[NV], shift[NV], pos[NV]; \
    __mmask16 on[NV]; \
    const uint8_t *wp[4 * NV]; /* each block's next word */ \
    T *out[4 * NV]; \
    for (int k = 0; k < 4 * NV; k++) { wp[k] = s[k]->in + s[k]->at; out[k] = (T *)s[k]->out + s[k]->i; } \
    for (int v = 0; v < NV; v++) { \
        narrow_t *const *b = s + 4 * v; \
        const int *l = reads + 4 * v; \
        x[v] = LANE4(_mm_loadu_si128((const __m128i *)b[0]->x), _mm_loadu_si128((const __m128i *)b[1]->x), \
                     _mm_loadu_si128((const __m128i *)b[2]->x), _mm_loadu_si128((const __m128i *)b[3]->x)); \
        mask[v] = LANE4(_mm_set1_epi32((int)b[0]->f.mask), _mm_set1_epi32((int)b[1]->f.mask), \
                        _mm_set1_epi32((int)b[2]->f.mask), _mm_set1_epi32((int)b[3]->f.mask)); \
        P[v] = LANE4(_mm_set1_epi32(b[0]->f.P), _mm_set1_epi32(b[1]->f.P), _mm_set1_epi32(b[2]->f.P), \
                     _mm_set1_epi32(b[3]->f.P)); \
        base[v] = LANE4(_mm_set1_epi32((int)(b[0]->f.stab - arena)), _mm_set1_epi32((int)(b[1]->f.stab - arena)), \
                        _mm_set1_epi32((int)(b[2]->f.stab - arena)), _mm_set1_epi32((int)(b[3]->f.stab - arena))); \
        dbase[v] = LANE4(_mm_set1_epi32(l[0] ? (int)((uintptr_t)b[0]->offs - (uintptr_t)obase) : 0), \
                         _mm_set1_epi32(l[1] ? (int)((uintptr_t)b[1]->offs - (uintptr_t)obase) : 0), \
                         _mm_set1_epi32(l[2] ? (int)((uintptr_t)b[2]->offs - (uintptr_t)obase) : 0), \
                         _mm_set1_epi32(l[3] ? (int)((uintptr_t)b[3]->offs - (uintptr_t)obase) : 0)); \
        shift[v] = LANE4(_mm_set1_epi32(b[0]->f.shift), _mm_set1_epi32(b[1]->f.shift), _mm_set1_epi32(b[2]->f.shift), \
                         _mm_set1_epi32(b[3]->f.shift)); \
        on[v] = (__mmask16)((l[0] ? 0xf : 0) | (l[1] ? 0xf0 : 0) | (l[2] ? 0xf00 : 0) | (l[3] ? 0xf000 : 0)); \
        pos[v] = LANE4(_mm_set1_epi32((int)b[0]->pos), _mm_set1_epi32((int)b[1]->pos), _mm_set1_epi32((int)b[2]->pos), \
                       _mm_set1_epi32((int)b[3]->pos)); \
    } \
    const __m512i lo16 = _mm512_set1_epi32(0xffff), low = _mm512_set1_epi32(RANS_L); \
    const __m512i one = _mm512_set1_epi32(1), seven = _mm512_set1_epi32(7), zero = _mm512_setzero_si512(); \
    const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30); \
    const __m512i odds = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31); \
    const __m512i quad = _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12); \
    for (int g = 0; g < MULTI_GROUPS; g++) { \
        __m512i h[NV]; \
        for (int v = 0; v < NV; v++) { /* each state's step: its slot's frequency | bias << 16, and its bin */ \
            __m512i slot = _mm512_add_epi32(_mm512_and_si512(x[v], mask[v]), base[v]); \
            __m512i ea = _mm512_i32gather_epi64(_mm512_castsi512_si256(slot), (const void *)arena, 8); \
            __m512i eb = _mm512_i32gather_epi64(_mm512_extracti64x4_epi64(slot, 1), (const void *)arena, 8); \
            __m512i e = _mm512_permutex2var_epi32(ea, evens, eb); \
            h[v] = _mm512_permutex2var_epi32(ea, odds, eb); \
            x[v] = _mm512_add_epi32(_mm512_mullo_epi32(_mm512_and_si512(e, lo16), _mm512_srlv_epi32(x[v], P[v])), \
                                    _mm512_srli_epi32(e, 16)); \
        } \
        for (int v = 0; v < NV; v++) { /* renormalization: each block's lanes from its next words, in lane order */ \
            const uint8_t **w4 = wp + 4 * v; \
            __mmask16 m = _mm512_cmplt_epu32_mask(x[v], low); \
            __m512i words = _mm512_cvtepu16_epi32(_mm256_setr_epi64x((long long)load8(w4[0]), (long long)load8(w4[1]), \
                                                                     (long long)load8(w4[2]), (long long)load8(w4[3]))); \
            __m512i c = _mm512_maskz_mov_epi32(m, one); \
            __m512i before = _mm512_add_epi32(_mm512_bslli_epi128(c, 4), \
                                              _mm512_add_epi32(_mm512_bslli_epi128(c, 8), _mm512_bslli_epi128(c, 12))); \
            __m512i w = _mm512_permutexvar_epi32(_mm512_add_epi32(quad, before), words); \
            x[v] = _mm512_mask_or_epi32(x[v], m, _mm512_slli_epi32(x[v], 16), w); \
            unsigned mm = (unsigned)m; \
            w4[0] += 2 * __builtin_popcount(mm & 15); \
            w4[1] += 2 * __builtin_popcount((mm >> 4) & 15); \
            w4[2] += 2 * __builtin_popcount((mm >> 8) & 15); \
            w4[3] += 2 * __builtin_popcount(mm >> 12); \
        } \
        for (int v = 0; v < NV; v++) { /* offsets: positions by a prefix sum of the widths within each block */ \
            __m512i wd = _mm512_srli_epi32(h[v], 16), lower = _mm512_and_si512(h[v], lo16); \
            if (sizeof(T) == 4) lower = _mm512_sllv_epi32(lower, shift[v]); \
            __m512i t = _mm512_add_epi32(wd, _mm512_bslli_epi128(wd, 4)); \
            t = _mm512_add_epi32(t, _mm512_bslli_epi128(t, 8)); \
            __m512i p = _mm512_add_epi32(pos[v], _mm512_sub_epi32(t, wd)); \
            pos[v] = _mm512_add_epi32(pos[v], _mm512_shuffle_epi32(t, 0xff)); \
            __m512i byte = _mm512_add_epi32(_mm512_srli_epi32(p, 3), dbase[v]), bit = _mm512_and_si512(p, seven); \
            __m512i got; \
            if (sizeof(T) == 4) { /* up to 7 + 32 bits from each lane's byte: 64-bit items */ \
                __m512i oa = _mm512_mask_i32gather_epi64(zero, (__mmask8)on[v], _mm512_castsi512_si256(byte), \
                                                         (const void *)obase, 1); \
                __m512i ob = _mm512_mask_i32gather_epi64(zero, (__mmask8)(on[v] >> 8), \
                                                         _mm512_extracti64x4_epi64(byte, 1), (const void *)obase, 1); \
                oa = _mm512_srlv_epi64(oa, _mm512_cvtepu32_epi64(_mm512_castsi512_si256(bit))); \
                ob = _mm512_srlv_epi64(ob, _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(bit, 1))); \
                got = _mm512_permutex2var_epi32(oa, evens, ob); \
            } else \
                got = _mm512_srlv_epi32(_mm512_mask_i32gather_epi32(zero, on[v], byte, (const void *)obase, 1), bit); \
            /* a width of 32 shifts the mask's 1 out: all ones, as it should */ \
            __m512i keep = _mm512_sub_epi32(_mm512_sllv_epi32(one, wd), one); \
            __m512i r = _mm512_add_epi32(lower, _mm512_and_si512(got, keep)); \
            T *const *o = out + 4 * v; \
            if (sizeof(T) == 4) { \
                _mm_storeu_si128((__m128i *)(o[0] + 4 * g), _mm512_castsi512_si128(r)); \
                _mm_storeu_si128((__m128i *)(o[1] + 4 * g), _mm512_extracti32x4_epi32(r, 1)); \
                _mm_storeu_si128((__m128i *)(o[2] + 4 * g), _mm512_extracti32x4_epi32(r, 2)); \
                _mm_storeu_si128((__m128i *)(o[3] + 4 * g), _mm512_extracti32x4_epi32(r, 3)); \
            } else if (sizeof(T) == 2) { \
                __m256i q = _mm512_cvtepi32_epi16(r); \
                __m128i q0 = _mm256_castsi256_si128(q), q1 = _mm256_extracti128_si256(q, 1); \
                _mm_storel_epi64((__m128i *)(o[0] + 4 * g), q0); \
                _mm_storel_epi64((__m128i *)(o[1] + 4 * g), _mm_unpackhi_epi64(q0, q0)); \
                _mm_storel_epi64((__m128i *)(o[2] + 4 * g), q1); \
                _mm_storel_epi64((__m128i *)(o[3] + 4 * g), _mm_unpackhi_epi64(q1, q1)); \
            } else { \
                __m128i q = _mm512_cvtepi32_epi8(r); \
                uint32_t f[4]; \
                _mm_storeu_si128((__m128i *)f, q); \
                for (int j = 0; j < 4; j++) memcpy(o[j] + 4 * g, &f[j], 4); \
            } \
        } \
    } \
    uint32_t lanes[16 * NV], bits[16 * NV]; \
    for (int v = 0; v < NV; v++) { \
        _mm512_storeu_si512((void *)(lanes + 16 * v), x[v]); \
        _mm512_storeu_si512((void *)(bits + 16 * v), pos[v]); \
    } \
    engine_save(s, 4 * NV, lanes, bits, wp); \
}
MULTI_ZMM(multi8_zmm_8, uint8_t, 2)
MULTI_ZMM(multi8_zmm_16, u16u, 2)
MULTI_ZMM(multi8_zmm_32, u32u, 2)
MULTI_ZMM(multi4_zmm_8, uint8_t, 1)
MULTI_ZMM(multi4_zmm_16, u16u, 1)
MULTI_ZMM(multi4_zmm_32, u32u, 1)
#undef MULTI_ZMM
#undef LANE4
#endif
#endif

/* The engine of one decode call for values of one width: its slots, their
 * tables (arena: a region of SLOT_ENTRIES entries each), and the first
 * stream (by position in the call) found damaged. */
typedef struct {
    narrow_t slot[MULTI_SLOTS];
    int used[MULTI_SLOTS];
    uint64_t *arena;
    int width, simd;
    const uint8_t *obase;  /* every busy slot's offsets lie within 2^31 bytes above it */
    Py_ssize_t failed;
    const char *error;
    uint8_t zeros[MULTI_WORD_READS], sink[16 * MULTI_GROUPS];  /* an idle slot's words and values */
} multi_t;

/* Engines' arenas kept between calls, at most KEPT_ARENAS (taken and
 * given back under kept_lock: calls run on many threads without the GIL;
 * tried, never waited for: a busy lock means a fresh arena, or one freed,
 * and a child forked while another thread held it never hangs on it).
 * A fresh arena's tables fault their pages in as they are built (8 to 64
 * pages a slot), a kept one's are mapped already: a fresh process's first
 * unpack of fracast took 342 page faults, 189 with arenas kept
 * (benchmarks/ab.py, unpack, 16 fresh processes each, mean: fracast 2.90
 * -> 2.64 ms, deepfilternet 6.01 -> 5.42, silero 0.978, pocketnet 0.980,
 * taesd 0.993, piper 1.000). Held: the pages the kept arenas' tables
 * touched, 2 MiB each at most. */
#define KEPT_ARENAS 4
static uint64_t *kept_arenas[KEPT_ARENAS];
static int kept_count = 0;
static PyThread_type_lock kept_lock = NULL;  /* made with the module */

static uint64_t *arena_take(void) {
    uint64_t *arena = NULL;
    if (kept_lock && PyThread_acquire_lock(kept_lock, NOWAIT_LOCK)) {
        if (kept_count) arena = kept_arenas[--kept_count];
        PyThread_release_lock(kept_lock);
    }
    return arena ? arena : PyMem_RawMalloc(sizeof(uint64_t) * MULTI_SLOTS * SLOT_ENTRIES);
}

static void arena_give(uint64_t *arena) {
    if (arena && kept_lock && PyThread_acquire_lock(kept_lock, NOWAIT_LOCK)) {
        if (kept_count < KEPT_ARENAS) { kept_arenas[kept_count++] = arena; arena = NULL; }
        PyThread_release_lock(kept_lock);
    }
    PyMem_RawFree(arena);
}

static multi_t *multi_new(int width, int simd) {
    multi_t *m = PyMem_RawCalloc(1, sizeof(multi_t));
    if (!m) return NULL;
    m->arena = arena_take();
    if (!m->arena) { PyMem_RawFree(m); return NULL; }
    m->width = width; m->simd = simd; m->failed = -1;
    return m;
}

static void multi_free(multi_t *m) {
    if (m) { arena_give(m->arena); PyMem_RawFree(m); }
}

static void multi_fail(multi_t *m, Py_ssize_t stream, const char *error) {
    if (m->failed < 0 || stream < m->failed) { m->failed = stream; m->error = error; }
}

/* Finish slot k's block alone (narrow_finish) and free the slot. */
static void multi_retire(multi_t *m, int k) {
    const char *error = narrow_finish(&m->slot[k], m->width, m->simd);
    if (error) multi_fail(m, m->slot[k].stream, error);
    m->used[k] = 0;
}

/* Whether a block can take a kernel call: the values, and its streams
 * holding every byte the call may read (of offsets: none where no bin has
 * offset bits, whose lanes the kernels' gathers leave out; such a block,
 * alone in its stream, has no bytes after its words, and the bound of
 * its offsets' reads kept it out of the engine from its first value:
 * smollm2's 4- and 5-bit fields, 3.1 M of its 13.3 M values in narrow
 * blocks, went alone). */
static int multi_ready(const narrow_t *b) {
    return b->n - b->i >= 4 * MULTI_GROUPS && b->at + MULTI_WORD_READS <= b->wread
           && (!b->widest || (b->pos >> 3) + b->mreads <= b->oread);
}

/* Kernel calls while every slot is busy; with `drain`, until every block is
 * done (the last two alone: a call costs about as much with one block as
 * with eight). Blocks near their ends are retired on the way. */
static void multi_run(multi_t *m, int drain) {
    for (;;) {
        int busy = 0;
        for (int k = 0; k < MULTI_SLOTS; k++)
            if (m->used[k]) {
                if (multi_ready(&m->slot[k])) busy++;
                else multi_retire(m, k);
            }
        if (!busy || (!drain && busy < MULTI_SLOTS)) return;
#ifndef HAVE_WIDE_AVX2
        busy = 0;  /* no kernel to call (multi_usable says so first) */
#endif
        if (busy <= 2) {
            for (int k = 0; k < MULTI_SLOTS; k++) if (m->used[k]) multi_retire(m, k);
            return;
        }
        /* the busy slots first; the kernel of two vectors where four slots hold them all */
        narrow_t idle[MULTI_SLOTS], *s[MULTI_SLOTS];
        int reads[MULTI_SLOTS], n = 0, slots = busy > 4 ? 8 : 4;  /* reads: whether its offsets are read */
        for (int k = 0; k < MULTI_SLOTS; k++)
            if (m->used[k]) { s[n] = &m->slot[k]; reads[n++] = m->slot[k].widest > 0; }
        for (int k = 0; k < MULTI_SLOTS && n < slots; k++) {
            if (m->used[k]) continue;
            /* an idle slot steps on zeros into the sink (its table's first two entries zero, its offsets masked off) */
            narrow_t *b = s[n] = &idle[n];
            reads[n++] = 0;
            memset(b, 0, sizeof *b);
            b->in = b->offs = m->zeros; b->out = m->sink;
            b->f.stab = m->arena + (size_t)k * SLOT_ENTRIES; b->f.P = 1; b->f.mask = 1;
            m->arena[(size_t)k * SLOT_ENTRIES] = m->arena[(size_t)k * SLOT_ENTRIES + 1] = 0;
            for (int j = 0; j < LANES; j++) b->x[j] = RANS_L;
        }
#ifdef HAVE_WIDE_ZMM
        if (wide_zmm_usable(m->simd)) {
            if (slots == 8) {
                if (m->width == 1) multi8_zmm_8(s, reads, m->arena, m->obase);
                else if (m->width == 2) multi8_zmm_16(s, reads, m->arena, m->obase);
                else multi8_zmm_32(s, reads, m->arena, m->obase);
            } else {
                if (m->width == 1) multi4_zmm_8(s, reads, m->arena, m->obase);
                else if (m->width == 2) multi4_zmm_16(s, reads, m->arena, m->obase);
                else multi4_zmm_32(s, reads, m->arena, m->obase);
            }
        } else
#endif
#ifdef HAVE_WIDE_AVX2
        {
        int near = 1;  /* 32-bit values: whether every block's offsets are at most NEAR_AVX2_BITS wide */
        for (int k = 0; k < slots; k++) near &= s[k]->widest <= NEAR_AVX2_BITS;
        if (slots == 8) {
            if (m->width == 1) multi8_avx2_8(s, reads, m->arena, m->obase);
            else if (m->width == 2) multi8_avx2_16(s, reads, m->arena, m->obase);
            else (near ? multi8_avx2_32_near : multi8_avx2_32)(s, reads, m->arena, m->obase);
        } else {
            if (m->width == 1) multi4_avx2_8(s, reads, m->arena, m->obase);
            else if (m->width == 2) multi4_avx2_16(s, reads, m->arena, m->obase);
            else (near ? multi4_avx2_32_near : multi4_avx2_32)(s, reads, m->arena, m->obase);
        }
        }
#endif
        for (int k = 0; k < MULTI_SLOTS; k++) {
            narrow_t *b = &m->slot[k];
            if (m->used[k] && (b->at > b->limit || b->pos > 8 * b->olimit)) {
                multi_fail(m, b->stream, "damaged stream");
                m->used[k] = 0;
            }
        }
    }
}

/* Whether a block's offsets (offs, offslen bytes) can join the engine: the
 * kernels read them with 32-bit offsets from m->obase, set 2^30 below the
 * first block's of an idle engine. */
static int multi_fits(multi_t *m, const uint8_t *offs, Py_ssize_t offslen) {
    int busy = 0;
    for (int k = 0; k < MULTI_SLOTS; k++) busy |= m->used[k];
    if (!busy) m->obase = (const uint8_t *)((uintptr_t)offs - ((uintptr_t)1 << 30));
    uintptr_t delta = (uintptr_t)offs - (uintptr_t)m->obase;
    return delta < ((uintptr_t)1 << 31) && delta + (uintptr_t)offslen + MULTI_OFFSET_READS + 8 < ((uintptr_t)1 << 31);
}

/* A checked narrow block into a slot of the engine (after kernel calls to
 * free one, where all are busy): NULL, or what is wrong with its start. */
static const char *multi_add(multi_t *m, const uint8_t *in, Py_ssize_t inlen, const uint8_t *offs, Py_ssize_t offslen,
                             Py_ssize_t spare, Py_ssize_t n, void *out, const uint32_t *freq, const uint32_t *lower,
                             const uint8_t *obits, Py_ssize_t bins, int P, int shift, Py_ssize_t stream) {
    int k = 0;
    while (k < MULTI_SLOTS && m->used[k]) k++;
    if (k == MULTI_SLOTS) {
        multi_run(m, 0);
        for (k = 0; k < MULTI_SLOTS && m->used[k]; k++) {}
    }
    uint64_t *stab = m->arena + (size_t)k * SLOT_ENTRIES;
    int widest = build_stab(freq, lower, obits, bins, shift, stab, m->simd);
    const char *error = narrow_start(&m->slot[k], in, inlen, offs, offslen, spare, n, out, stab, P, shift, widest);
    if (error) return error;
    m->slot[k].stream = stream;
    m->used[k] = 1;
    return NULL;
}

/* Whether blocks of this call may go through the engine: AVX2 here, and not turned off. */
static int multi_usable(int simd) {
    return simd && wide_simd_usable();
}

/* c * log2(c), from a table for small counts (most nodes of a trie). */
#define XLOGX_TABLE 4096
static double xlogx_table[XLOGX_TABLE];
static int xlogx_ready = 0;

static void *trie_arena = NULL;
static size_t trie_arena_size = 0;

static inline double xlogx(int64_t c) {
    if (c < XLOGX_TABLE) return xlogx_table[c];
    return (double)c * log2((double)c);
}

/* Scratch shared by every thread: used only while the GIL is held (every
 * function that releases it works on its own buffers). */
static int64_t key_counts[1 << 16];
static uint32_t key_ids[1 << 16];
static int64_t key_cnts[1 << 16];
static uint32_t key_hist[4 << 16] __attribute__((aligned(64)));  /* trie_values' four histograms, zero between calls */
static uint64_t key_bits_set[(1 << 16) / 64];  /* trie_values' occupied keys, zero between calls */

/* The trie of brevis/dsl/entropy.py's trie_of_counts over d0 occupied keys
 * (sorted ids, their counts), bottom-up over the occupied nodes only (at
 * most d0 a level), as (codes one byte each in pre-order, the bins' first
 * keys as uint32, their levels as uint8, the estimated cost in bits less
 * n*log2(n), each bin's count as int64). */
typedef struct {
    const uint8_t *codes; Py_ssize_t ncodes;  /* one byte each, in pre-order */
    const uint32_t *firsts; const uint8_t *levels; const int64_t *counts; Py_ssize_t nbins;
    double cost;
} trie_t;

/* A trie node at `level` from its lower half (count c0, best cost b0) and,
 * where `two`, its upper one (c1, b1; else unused): its count into *c, its
 * best cost into *best, and whether splitting it costs less than one bin.
 * The one step trie_core and trie_summary take: both make the same doubles. */
static inline __attribute__((always_inline)) int trie_node(int level, int two, int64_t c0, double b0, int64_t c1,
                                                           double b1, double bin_cost, double node_cost, int64_t *c,
                                                           double *best) {
    *c = c0 + (two ? c1 : 0);
    double halves = b0 + (two ? b1 : node_cost) + node_cost;
    double leaf = (double)*c * level - xlogx(*c) + bin_cost;
    *best = halves < leaf ? halves : leaf;
    return halves < leaf;
}

/* The trie into the arena (valid until the next call; the GIL held); -1 when out of memory. */
static int trie_core(const uint32_t *in_ids, const int64_t *in_cnts, Py_ssize_t d0, int key_bits,
                     double bin_cost, double node_cost, trie_t *t) {
    Py_ssize_t d = d0 ? d0 : 1;
    int levels_n = key_bits + 1;
    /* Per level L, at [L * d, L * d + size[L]): id, count, best, split, first
     * child. One arena kept between calls (the GIL is held throughout): the
     * search asks for thousands of tries, and fresh pages cost more than the work. */
    size_t need = (size_t)d * levels_n * (4 + 8 + 8 + 1 + 4 + 4) + (size_t)d * 14 + 64 * (size_t)levels_n + 64;
    if (need > trie_arena_size) {
        void *grown = PyMem_Realloc(trie_arena, need);
        if (!grown) return -1;
        trie_arena = grown; trie_arena_size = need;
    }
    uint8_t *arena = trie_arena;
    size_t cells = (size_t)d * levels_n;
    int64_t *cnt = (int64_t *)arena; arena += 8 * cells;
    double *best = (double *)arena; arena += 8 * cells;
    Py_ssize_t *size = (Py_ssize_t *)arena; arena += 8 * (size_t)levels_n;
    Py_ssize_t *stack = (Py_ssize_t *)arena; arena += 8 * 3 * (size_t)(key_bits + 2);
    uint32_t *id = (uint32_t *)arena; arena += 4 * cells;
    uint32_t *child = (uint32_t *)arena; arena += 4 * cells;
    uint32_t *firsts = (uint32_t *)arena; arena += 4 * (size_t)d;
    uint8_t *codes = arena; arena += 4 * cells + 1;
    uint8_t *split = arena; arena += cells;
    uint8_t *levels = arena; arena += d;
    int64_t *bin_counts = (int64_t *)(((uintptr_t)arena + 7) & ~(uintptr_t)7);
    for (Py_ssize_t k = 0; k < d0; k++) {
        id[k] = in_ids[k]; cnt[k] = in_cnts[k]; split[k] = 0; child[k] = 0;
        best[k] = bin_cost - xlogx(in_cnts[k]);
    }
    size[0] = d0;
    for (int level = 1; level < levels_n; level++) {
        Py_ssize_t lo = (Py_ssize_t)(level - 1) * d, up = (Py_ssize_t)level * d, m = 0;
        for (Py_ssize_t i = 0; i < size[level - 1];) {
            uint32_t parent = id[lo + i] >> 1;
            int two = i + 1 < size[level - 1] && (id[lo + i + 1] >> 1) == parent;
            split[up + m] = (uint8_t)trie_node(level, two, cnt[lo + i], best[lo + i], two ? cnt[lo + i + 1] : 0,
                                               two ? best[lo + i + 1] : 0.0, bin_cost, node_cost, &cnt[up + m],
                                               &best[up + m]);
            id[up + m] = parent; child[up + m] = (uint32_t)i;
            m++;
            i += two ? 2 : 1;
        }
        size[level] = m;
    }
    double cost = size[key_bits] ? best[(Py_ssize_t)key_bits * d] : node_cost;
    /* Pre-order walk, lower half first: a stack of (level, index or -1, node). */
    Py_ssize_t ncodes = 0, nbins = 0, top = 0;
    stack[top++] = key_bits; stack[top++] = size[key_bits] ? 0 : -1; stack[top++] = 0;
    while (top) {
        Py_ssize_t node = stack[--top], at = stack[--top];
        int level = (int)stack[--top];
        if (at < 0) { codes[ncodes++] = 0; continue; }
        Py_ssize_t here = (Py_ssize_t)level * d + at;
        if (split[here]) {
            codes[ncodes++] = 2;
            Py_ssize_t lo = (Py_ssize_t)(level - 1) * d, c0 = child[here];
            Py_ssize_t left = -1, right = -1;
            if (id[lo + c0] == (uint32_t)(2 * node)) {
                left = c0;
                if (c0 + 1 < size[level - 1] && id[lo + c0 + 1] == (uint32_t)(2 * node + 1)) right = c0 + 1;
            } else {
                right = c0;
            }
            stack[top++] = level - 1; stack[top++] = right; stack[top++] = 2 * node + 1;
            stack[top++] = level - 1; stack[top++] = left; stack[top++] = 2 * node;
        } else {
            codes[ncodes++] = 1;
            firsts[nbins] = (uint32_t)(node << level); bin_counts[nbins] = cnt[here]; levels[nbins++] = (uint8_t)level;
        }
    }
    t->codes = codes; t->ncodes = ncodes; t->firsts = firsts; t->levels = levels; t->counts = bin_counts;
    t->nbins = nbins; t->cost = cost;
    return 0;
}

/* Of trie_core's trie, only its cost and how many bins and codes it has,
 * in place: a level's nodes overwrite the level below (node m of a level
 * is made from nodes m.. of the one below, read before), each carrying its
 * best subtree's bins and splits (a pre-order walk writes 2 * splits + 1
 * codes: every split has two children, a bin, a split or an empty half).
 * The same steps and doubles as trie_core, in one level's space instead
 * of every level's and without the walk: a sample of 16-bit fields of
 * 20,000 distinct keys had trie_core write 12 MB, past the caches. */
static int trie_summary(const uint32_t *in_ids, const int64_t *in_cnts, Py_ssize_t d0, int key_bits,
                        double bin_cost, double node_cost, trie_t *t) {
    Py_ssize_t d = d0 ? d0 : 1;
    size_t need = (size_t)d * (4 + 8 + 8 + 4 + 4) + 64;
    if (need > trie_arena_size) {
        void *grown = PyMem_Realloc(trie_arena, need);
        if (!grown) return -1;
        trie_arena = grown; trie_arena_size = need;
    }
    int64_t *cnt = (int64_t *)trie_arena;
    double *best = (double *)(cnt + d);
    uint32_t *id = (uint32_t *)(best + d), *bins = id + d, *splits = bins + d;
    for (Py_ssize_t k = 0; k < d0; k++) {
        id[k] = in_ids[k]; cnt[k] = in_cnts[k]; bins[k] = 1; splits[k] = 0;
        best[k] = bin_cost - xlogx(in_cnts[k]);
    }
    Py_ssize_t size = d0;
    for (int level = 1; level <= key_bits; level++) {
        Py_ssize_t m = 0;
        for (Py_ssize_t i = 0; i < size;) {
            uint32_t parent = id[i] >> 1;
            int two = i + 1 < size && (id[i + 1] >> 1) == parent;
            int64_t c;
            double cost;
            int halved = trie_node(level, two, cnt[i], best[i], two ? cnt[i + 1] : 0, two ? best[i + 1] : 0.0, bin_cost,
                                   node_cost, &c, &cost);
            uint32_t b = halved ? bins[i] + (two ? bins[i + 1] : 0) : 1;
            uint32_t sp = halved ? 1 + splits[i] + (two ? splits[i + 1] : 0) : 0;
            id[m] = parent; cnt[m] = c; best[m] = cost; bins[m] = b; splits[m] = sp;
            m++;
            i += two ? 2 : 1;
        }
        size = m;
    }
    t->codes = NULL; t->firsts = NULL; t->levels = NULL; t->counts = NULL;
    t->cost = size ? best[0] : node_cost;
    t->nbins = size ? bins[0] : 0;
    t->ncodes = size ? 2 * (Py_ssize_t)splits[0] + 1 : 1;
    return 0;
}

static PyObject *build_trie(const uint32_t *in_ids, const int64_t *in_cnts, Py_ssize_t d0, int key_bits,
                            double bin_cost, double node_cost) {
    trie_t t;
    if (trie_core(in_ids, in_cnts, d0, key_bits, bin_cost, node_cost, &t) < 0) return PyErr_NoMemory();
    return Py_BuildValue("(y#y#y#dy#)", (const char *)t.codes, t.ncodes, (const char *)t.firsts, t.nbins * 4,
                         (const char *)t.levels, t.nbins, t.cost, (const char *)t.counts, t.nbins * 8);
}


/* Whether any of 16 counts (64-byte aligned: key_hist's) is not zero. */
static inline int any16(const uint32_t *h) {
    const uint64_t *w = (const uint64_t *)h;
    return (w[0] | w[1] | w[2] | w[3] | w[4] | w[5] | w[6] | w[7]) != 0;
}

/* Whether every one of n values is below 2^bits: their OR is (one pass,
 * which the compiler vectorizes, where a value at a time costs a compare
 * and a branch). */
static int all_below(const void *values, Py_ssize_t n, int width, int bits) {
    uint32_t any = 0;
    if (width == 1) { const uint8_t *v = values; uint8_t o = 0; for (Py_ssize_t i = 0; i < n; i++) o |= v[i]; any = o; }
    else if (width == 2) { const uint16_t *v = values; uint16_t o = 0; for (Py_ssize_t i = 0; i < n; i++) o |= v[i]; any = o; }
    else { const uint32_t *v = values; for (Py_ssize_t i = 0; i < n; i++) any |= v[i]; }
    return bits >= 32 || (any >> bits) == 0;
}

/* The occupied keys (value >> shift, below 2^key_bits) of n values, in
 * increasing order, into key_ids and their counts into key_cnts (scratch:
 * the GIL held); how many, or -1 where a key is out of range. */
static Py_ssize_t count_keys(const void *values, Py_ssize_t n, int width, int shift, int key_bits) {
    Py_ssize_t keys = (Py_ssize_t)1 << key_bits, d = 0;
    uint64_t widest = width == 4 ? 0xFFFFFFFFu : ((uint64_t)1 << (8 * width)) - 1;
    /* Every key in range, by the values' container or by one pass over them:
     * a field narrower than its container (nibbles, an F32's 23-bit
     * mantissas) took the per-value loop below, whose counters wait on each
     * other where a few keys take most values (encode_block, 2^19 values,
     * best of 40, 2026-12-07, the Intel Xeon: bell-shaped nibbles 3.0 ->
     * 1.4 ns a value; coder_kernels, minilm's 23-bit fields 5.5 -> 5.1,
     * trie_values 2.5 -> 2.2). */
    if (n >= keys && n < ((Py_ssize_t)1 << 32)
        && ((widest >> shift) < (uint64_t)keys || all_below(values, n, width, shift + key_bits))) {
        /* Many values, every key in range: histograms of 32-bit counts, then
         * one scan of the keys. Four of them (value i in histogram i % 4)
         * where a few keys take most values (a constant, sparse or
         * exponent-like block: one counter's increments would wait on each
         * other, 2.5 against 0.8 ns a value), else one (16-bit keys spread
         * over thousands: four histograms touch four times the lines,
         * nomic's F16 weights 1.4 against 0.9 ns a value), told by the keys
         * of eight probes of 512 values spread over the block. The
         * one-histogram loop below took 4.9 ns a value on minilm's blocks,
         * a third of compressing it. */
        uint32_t *h = key_hist;
        Py_ssize_t i = 0;
        int ways = 4;
        if (key_bits > 8) {  /* (a byte's four histograms lie in cache anyway) */
            Py_ssize_t probed = 0, distinct = 0;
            for (int p = 0; p < 8; p++)
                for (Py_ssize_t j = (n - 512) / 8 * p, stop = j + 512; j < stop; j++, probed++) {
                    uint32_t key = load(values, width, j) >> shift;
                    uint64_t bit = (uint64_t)1 << (key & 63);
                    distinct += !(key_bits_set[key >> 6] & bit);
                    key_bits_set[key >> 6] |= bit;
                }
            for (Py_ssize_t j = 0; j < keys / 64; j++) key_bits_set[j] = 0;
            if (8 * distinct >= probed) ways = 1;  /* keys seen eight times each or fewer */
        }
#define COUNT4(T, S) { const T *v = values; \
        if (ways == 4) \
            for (; i + 4 <= n; i += 4) { \
                h[v[i] >> (S)]++; h[(1 << 16) + (v[i + 1] >> (S))]++; \
                h[(2 << 16) + (v[i + 2] >> (S))]++; h[(3 << 16) + (v[i + 3] >> (S))]++; \
            } \
        else \
            for (; i + 4 <= n; i += 4) { \
                h[v[i] >> (S)]++; h[v[i + 1] >> (S)]++; h[v[i + 2] >> (S)]++; h[v[i + 3] >> (S)]++; \
            } \
        for (; i < n; i++) h[v[i] >> (S)]++; }
        /* values of 8 and 16 bits are their own keys (shift 0, as the
         * coder asks): a constant shift leaves four loads and four increments */
        if (shift == 0 && width == 1) COUNT4(uint8_t, 0)
        else if (shift == 0 && width == 2) COUNT4(uint16_t, 0)
        else if (width == 1) COUNT4(uint8_t, shift)
        else if (width == 2) COUNT4(uint16_t, shift)
        else COUNT4(uint32_t, shift)
#undef COUNT4
        /* The occupied keys, 16 at a time: a run of 16 empty ones is told
         * by one OR of eight words and skipped (a float's top bits occupy a
         * few runs of the 65,536: the key-by-key scan was about as long as
         * the counting, on a sample of 65,536 F32 values). */
        Py_ssize_t group = keys < 16 ? keys : 16;
        if (ways == 1)  /* (the other three are zero: 768 KiB not read again) */
            for (Py_ssize_t k0 = 0; k0 < keys; k0 += group) {
                if (group == 16 && !any16(h + k0)) continue;
                for (Py_ssize_t k = k0; k < k0 + group; k++)
                    if (h[k]) { key_ids[d] = (uint32_t)k; key_cnts[d++] = h[k]; h[k] = 0; }
            }
        else
            for (Py_ssize_t k0 = 0; k0 < keys; k0 += group) {
                if (group == 16 && !(any16(h + k0) | any16(h + (1 << 16) + k0) | any16(h + (2 << 16) + k0) |
                                     any16(h + (3 << 16) + k0)))
                    continue;
                for (Py_ssize_t k = k0; k < k0 + group; k++) {
                    uint64_t c = (uint64_t)h[k] + h[(1 << 16) + k] + h[(2 << 16) + k] + h[(3 << 16) + k];
                    if (c) {
                        key_ids[d] = (uint32_t)k; key_cnts[d++] = (int64_t)c;
                        h[k] = h[(1 << 16) + k] = h[(2 << 16) + k] = h[(3 << 16) + k] = 0;
                    }
                }
            }
        return d;
    }
    /* Fewer values than keys: each key's bit set at every value, without
     * a branch on whether it is the key's first (that branch mispredicted
     * on every new key: 3 ns a value on an F16 sample of 32,768). */
    int bad = 0;
#define COUNT_SET(T) { const T *v = values; \
        for (Py_ssize_t i = 0; i < n; i++) { \
            uint32_t key = (uint32_t)(v[i] >> shift); \
            if ((Py_ssize_t)key >= keys) { bad = 1; break; } \
            key_counts[key]++; \
            key_bits_set[key >> 6] |= (uint64_t)1 << (key & 63); \
        } }
    if (width == 1) COUNT_SET(uint8_t)
    else if (width == 2) COUNT_SET(uint16_t)
    else COUNT_SET(uint32_t)
#undef COUNT_SET
    /* The occupied keys in order from the bitmap: a word per 64 keys, where
     * a scan of every key cost 65 us per block of 4096 BF16 values (22 ns a
     * value) and a sort of the keys about as much. Left zero either way. */
    for (Py_ssize_t w = 0; w < (keys + 63) / 64; w++) {
        uint64_t bits = key_bits_set[w];
        key_bits_set[w] = 0;
        while (bits) {
            uint32_t key = (uint32_t)(w * 64 + __builtin_ctzll(bits));
            bits &= bits - 1;
            key_ids[d] = key; key_cnts[d++] = key_counts[key]; key_counts[key] = 0;
        }
    }
    return bad ? -1 : d;
}

/* key_counts(values, width) -> (keys, counts): the distinct values of
 * 8 or 16-bit values in increasing order (uint32) and how many times each
 * is there (int64): numpy's bincount and flatnonzero of them, without the
 * 65,536-entry array a 16-bit field's bincount makes and scans (the
 * search's proposals ask this of every value it opens). */
static PyObject *rans_key_counts(PyObject *self, PyObject *args) {
    PyObject *obj;
    int width;
    if (!PyArg_ParseTuple(args, "Oi", &obj, &width)) return NULL;
    if (width != 1 && width != 2) { PyErr_SetString(PyExc_ValueError, "width must be 1 or 2"); return NULL; }
    buf_t b[1] = {{0}};
    if (take(obj, &b[0], 0, "values") < 0) return NULL;
    Py_ssize_t d = count_keys(b[0].v.buf, b[0].v.len / width, width, 0, 8 * width);
    release(b, 1);
    return Py_BuildValue("(y#y#)", (const char *)key_ids, d * 4, (const char *)key_cnts, d * 8);
}

/* The arguments trie_values and trie_cost share (values, width, shift,
 * key_bits, bin_cost, node_cost), the values' keys counted into key_ids
 * and key_cnts: how many, or -1 with an exception set. */
static Py_ssize_t trie_keys(PyObject *args, const char *name, int *key_bits, double *bin_cost, double *node_cost) {
    PyObject *obj;
    int width, shift;
    if (!PyArg_ParseTuple(args, "Oiiidd", &obj, &width, &shift, key_bits, bin_cost, node_cost)) return -1;
    if ((width != 1 && width != 2 && width != 4) || shift < 0 || shift > 31 || *key_bits < 0 || *key_bits > 16) {
        PyErr_Format(PyExc_ValueError, "bad %s arguments", name);
        return -1;
    }
    buf_t b[1] = {{0}};
    if (take(obj, &b[0], 0, "values") < 0) return -1;
    Py_ssize_t d = count_keys(b[0].v.buf, b[0].v.len / width, width, shift, *key_bits);
    release(b, 1);
    if (d < 0) PyErr_SetString(PyExc_ValueError, "a key is out of range");
    return d;
}

/* trie_values(values, width, shift, key_bits, bin_cost, node_cost): the
 * trie of the keys value >> shift, counted here (no 2^key_bits array
 * per call: a sample of a few thousand values touches a few thousand keys). */
static PyObject *rans_trie_values(PyObject *self, PyObject *args) {
    int key_bits;
    double bin_cost, node_cost;
    Py_ssize_t d = trie_keys(args, "trie_values", &key_bits, &bin_cost, &node_cost);
    if (d < 0) return NULL;
    return build_trie(key_ids, key_cnts, d, key_bits, bin_cost, node_cost);
}

/* trie_cost(values, width, shift, key_bits, bin_cost, node_cost) ->
 * (bins, codes, bits): of trie_values' trie, the number of bins, of codes
 * and its cost, without the trie itself (the search's estimates ask no more). */
static PyObject *rans_trie_cost(PyObject *self, PyObject *args) {
    int key_bits;
    double bin_cost, node_cost;
    Py_ssize_t d = trie_keys(args, "trie_cost", &key_bits, &bin_cost, &node_cost);
    if (d < 0) return NULL;
    trie_t t;
    if (trie_summary(key_ids, key_cnts, d, key_bits, bin_cost, node_cost, &t) < 0) return PyErr_NoMemory();
    return Py_BuildValue("(nnd)", t.nbins, t.ncodes, t.cost);
}

/* key -> bin, for encode_block (the GIL held): 0 between calls, so that
 * every entry names a bin of the block coded (encode_body reads it unchecked) */
static uint16_t rank_table[1 << 16];

static int bit_length(uint64_t v) { return v ? 64 - __builtin_clzll(v) : 0; }

/* normalize's order of the bins: larger frequency first, ties in bin order
 * (numpy's stable argsort of -freq): two stable counting passes over the
 * 16-bit key 2^16 - freq (1 <= freq <= 2^16), where qsort took 100 us on
 * the 2,000 bins of a BF16 block. tmp: bins entries of scratch. */
static void order_by_freq(const int64_t *freq, Py_ssize_t bins, Py_ssize_t *order, Py_ssize_t *tmp) {
    Py_ssize_t *from = tmp, *to = order;
    for (Py_ssize_t r = 0; r < bins; r++) from[r] = r;
    for (int pass = 0; pass < 2; pass++) {
        Py_ssize_t count[257] = {0};
        for (Py_ssize_t k = 0; k < bins; k++) count[(((1 << 16) - freq[from[k]]) >> (8 * pass) & 0xff) + 1]++;
        for (int v = 0; v < 256; v++) count[v + 1] += count[v];
        for (Py_ssize_t k = 0; k < bins; k++) to[count[((1 << 16) - freq[from[k]]) >> (8 * pass) & 0xff]++] = from[k];
        Py_ssize_t *swap = from; from = to; to = swap;
    }
    if (from != order) memcpy(order, from, sizeof(Py_ssize_t) * bins);
}

static void put_varint(uint8_t *out, size_t *pos, uint64_t v) {
    while (v >= 0x80) { out[(*pos)++] = (uint8_t)((v & 0x7f) | 0x80); v >>= 7; }
    out[(*pos)++] = (uint8_t)v;
}

/* The occupied keys of a block from its counts already made (int64 per
 * key, `have` of them: choose_block's histogram of a field of at most 8
 * bits), into key_ids and key_cnts as count_keys would put them; -1 where
 * a key past 2^key_bits is counted or the counts do not add up to n. */
static Py_ssize_t keys_of_counts(const int64_t *counts, Py_ssize_t have, int key_bits, Py_ssize_t n) {
    Py_ssize_t keys = (Py_ssize_t)1 << key_bits, d = 0;
    int64_t total = 0;
    for (Py_ssize_t k = 0; k < have; k++) {
        int64_t c = counts[k];
        if (c < 0 || (c && k >= keys)) return -1;
        if (c) { key_ids[d] = (uint32_t)k; key_cnts[d++] = c; total += c; }
    }
    return total == n ? d : -1;
}

/* A bytes object being written: `pos` bytes written of `cap` made. */
typedef struct { PyObject *bytes; size_t pos, cap; } grow_t;

/* Room for `more` bytes past pos: the object made, or grown by half at
 * least (-1, MemoryError, where it cannot be; the object is then freed). */
static int grow_reserve(grow_t *g, size_t more) {
    if (g->bytes && g->pos + more <= g->cap) return 0;
    size_t cap = g->cap + g->cap / 2;
    if (cap < g->pos + more) cap = g->pos + more;
    if (cap > (size_t)PY_SSIZE_T_MAX) { Py_CLEAR(g->bytes); PyErr_NoMemory(); return -1; }
    if (!g->bytes) g->bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)cap);
    else if (_PyBytes_Resize(&g->bytes, (Py_ssize_t)cap) < 0) g->bytes = NULL;
    if (!g->bytes) return -1;
    g->cap = cap;
    return 0;
}

/* The bytes written, the object cut to them (a new reference; NULL with the error set). */
static PyObject *grow_finish(grow_t *g) {
    if (!g->bytes && grow_reserve(g, 0) < 0) return NULL;
    if (g->pos < g->cap && _PyBytes_Resize(&g->bytes, (Py_ssize_t)g->pos) < 0) return NULL;
    PyObject *out = g->bytes;
    g->bytes = NULL;
    return out;
}

static size_t varint_length(uint64_t v) {
    size_t k = 1;
    while (v >= 0x80) { v >>= 7; k++; }
    return k;
}

/* One block of n values (its model, rANS part and offsets) written into g
 * at g->pos, after its length as a varint where `sized` (a block of a
 * stream of several); the bytes go straight into the result, which a
 * copy into a bytes object (and the stream's join) cost 3 % of compressing
 * nomic. `counts`: the block's key counts made by the caller (`have` int64,
 * shift 0: keys are values), or NULL. -1 with the error set. */
static int encode_into(const void *values, Py_ssize_t n, int width, int bits, double bin_cost, double node_cost,
                       int lanes, int simd, const int64_t *counts, Py_ssize_t have, grow_t *g, int sized) {
    int shift = bits > 16 ? bits - 16 : 0, key_bits = bits - shift, status = -1;
    int64_t *freq = NULL;
    uint32_t *f32 = NULL, *cum = NULL, *lower = NULL;
    uint8_t *obits = NULL;
    uint16_t *ranks = NULL;
    Py_ssize_t *order = NULL;
    enc_t e = {0};
    e.lanes = lanes;
    if (n < 1) { PyErr_SetString(PyExc_ValueError, "an empty block"); return -1; }
    Py_ssize_t d;
    if (counts != NULL) {
        d = shift ? -1 : keys_of_counts(counts, have, key_bits, n);
        if (d < 0) {
            PyErr_SetString(PyExc_ValueError, shift ? "counts are for fields of at most 16 bits"
                                                    : "the counts are not the block's");
            return -1;
        }
    } else {
        d = count_keys(values, n, width, shift, key_bits);
        if (d < 0) { PyErr_SetString(PyExc_ValueError, "a key is out of range"); return -1; }
    }
    trie_t t;
    if (trie_core(key_ids, key_cnts, d, key_bits, bin_cost, node_cost, &t) < 0) { PyErr_NoMemory(); return -1; }
    Py_ssize_t bins = t.nbins;
    /* precision(n, bins) */
    int P = bit_length((uint64_t)n) + 1;
    if (P < 8) P = 8;
    if (P > 12) P = 12;
    if (bit_length((uint64_t)(bins - 1)) > P) P = bit_length((uint64_t)(bins - 1));
    if (P < 1) P = 1;
    freq = PyMem_Malloc(sizeof(int64_t) * bins);
    order = PyMem_Malloc(2 * sizeof(Py_ssize_t) * bins);
    f32 = PyMem_Malloc(4 * bins); cum = PyMem_Malloc(4 * bins); lower = PyMem_Malloc(4 * bins);
    obits = PyMem_Malloc(bins);
    ranks = PyMem_Malloc(2 * (size_t)n);
    e.words = PyMem_Malloc(((size_t)n * 2 + 2) * 2);
    e.offs = PyMem_Malloc((size_t)n * 4 + 8);
    e.sym = PyMem_Malloc(sizeof(sym_t) * bins);
    e.rec = PyMem_Malloc(16 * bins);
    /* one bin: its frequency is 2^P, its x_max 2^32, which the kernel's records do not hold */
    e.avx2 = lanes == WIDE_LANES && simd && bins > 1 && wide_simd_usable();
#ifdef HAVE_WIDE_ZMM
    e.zmm = width == 1 && wide_zmm_usable(simd);  /* simd 0: the scalar loops (the tests hold both to the same bytes) */
    e.wide_zmm = e.avx2 && wide_zmm_usable(simd);
    e.small_zmm = e.wide_zmm && simd == 1;  /* simd 4: the gathers alone (the tests hold both to the same bytes) */
#endif
    e.bytes_table = width == 1 && !e.zmm && simd;  /* simd 0: the loop of three tables */
    if (!freq || !order || !f32 || !cum || !lower || !obits || !ranks || !e.words || !e.offs || !e.sym || !e.rec) {
        PyErr_NoMemory(); goto done;
    }
    /* normalize(counts, P) */
    int64_t total = (int64_t)1 << P, sum = 0, had = 0;
    for (Py_ssize_t r = 0; r < bins; r++) sum += t.counts[r];
    double scale = (double)total / (double)sum;
    for (Py_ssize_t r = 0; r < bins; r++) {
        double f = rint((double)t.counts[r] * scale);
        freq[r] = f < 1.0 ? 1 : (int64_t)f;
        had += freq[r];
    }
    int64_t excess = had - total;
    order_by_freq(freq, bins, order, order + bins);
    if (excess < 0) freq[order[0]] -= excess;
    while (excess > 0) {  /* take from the largest, never below 1 */
        for (Py_ssize_t k = 0; k < bins && excess; k++) {
            int64_t fi = freq[order[k]], take = fi / 8 > 1 ? fi / 8 : 1;
            if (take > fi - 1) take = fi - 1;
            if (take > excess) take = excess;
            freq[order[k]] -= take;
            excess -= take;
        }
    }
    uint32_t c = 0;
    for (Py_ssize_t r = 0; r < bins; r++) {
        f32[r] = (uint32_t)freq[r]; cum[r] = c; c += (uint32_t)freq[r];
        lower[r] = t.firsts[r] << shift; obits[r] = (uint8_t)(t.levels[r] + shift);
    }
    /* ranks: the bins tile the occupied keys in increasing order; only
     * those keys get an entry (filling every key from the first cost 65 us
     * a block) */
    for (Py_ssize_t j = 0, r = 0; j < d; j++) {
        while (r + 1 < bins && key_ids[j] >= t.firsts[r + 1]) r++;
        rank_table[key_ids[j]] = (uint16_t)r;
    }
    e.ranks = ranks;
    int failed = encode_core(rank_table, shift, values, n, width, f32, cum, lower, obits, bins, P, &e, simd) < 0;
    for (Py_ssize_t j = 0; j < d; j++) rank_table[key_ids[j]] = 0;  /* (d writes: the keys set above) */
    if (failed) {
        PyErr_SetString(PyExc_ValueError, "a value lies outside its bin"); goto done;
    }
    /* model: P, the trie's codes four to a byte, freq - 1 varints; the rANS
     * length varint, the rANS bytes, the offsets */
    size_t rlen = 4 * (size_t)lanes + e.nwords * 2, length = 1 + (t.ncodes + 3) / 4 + varint_length(rlen) + rlen + e.noffs;
    for (Py_ssize_t r = 0; r < bins; r++) length += varint_length((uint64_t)(freq[r] - 1));
    if (grow_reserve(g, length + (sized ? varint_length(length) : 0)) < 0) goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(g->bytes);
    size_t pos = g->pos;
    if (sized) put_varint(out, &pos, length);
    out[pos++] = (uint8_t)P;
    for (Py_ssize_t k = 0; k < t.ncodes; k += 4) {
        uint8_t byte = 0;
        for (int j = 0; j < 4 && k + j < t.ncodes; j++) byte |= (uint8_t)(t.codes[k + j] << (2 * j));
        out[pos++] = byte;
    }
    for (Py_ssize_t r = 0; r < bins; r++) put_varint(out, &pos, (uint64_t)(freq[r] - 1));
    put_varint(out, &pos, rlen);
    put_rans(&e, out + pos);
    pos += rlen;
    memcpy(out + pos, e.offs, e.noffs);
    g->pos = pos + e.noffs;
    status = 0;
done:
    PyMem_Free(freq); PyMem_Free(order); PyMem_Free(f32); PyMem_Free(cum); PyMem_Free(lower); PyMem_Free(obits);
    PyMem_Free(ranks); PyMem_Free(e.words); PyMem_Free(e.offs); PyMem_Free(e.sym); PyMem_Free(e.rec);
    return status;
}

static int encode_arguments_ok(int width, int bits, int lanes) {
    if ((width != 1 && width != 2 && width != 4) || bits < 1 || bits > 8 * width || (lanes != LANES && lanes != WIDE_LANES)) {
        PyErr_SetString(PyExc_ValueError, "bad encode arguments");
        return 0;
    }
    return 1;
}

/* A block's counts (int64, a multiple of 8 bytes) taken from obj into cb: 0, or -1 with the error set. */
static int take_counts(PyObject *obj, buf_t *cb) {
    if (take(obj, cb, 0, "counts") < 0) return -1;
    if (cb->v.len % 8) { PyErr_SetString(PyExc_ValueError, "the counts are not the block's"); return -1; }
    return 0;
}

/* encode_block(values, width, bits, bin_cost, node_cost, lanes=4, simd=1, counts=None) -> bytes
 * One block of the `ans` stream as entropy.py's _encode_block writes it
 * (its model, rANS part and offsets), every step here: the Python steps
 * cost 40 us a block, a third of coding BF16 weights in blocks of 4096.
 * The precision and the frequencies are entropy.py's precision() and
 * normalize(), to the bit (the golden fixtures and the C-against-Python
 * tests check it). */
static PyObject *rans_encode_block(PyObject *self, PyObject *args) {
    PyObject *obj, *counts_obj = Py_None;
    int width, bits, lanes = LANES, simd = 1;
    double bin_cost, node_cost;
    if (!PyArg_ParseTuple(args, "Oiidd|iiO", &obj, &width, &bits, &bin_cost, &node_cost, &lanes, &simd, &counts_obj))
        return NULL;
    if (!encode_arguments_ok(width, bits, lanes)) return NULL;
    buf_t b[2] = {{0}};
    grow_t g = {0};
    PyObject *result = NULL;
    if (take(obj, &b[0], 0, "values") < 0) goto done;
    if (counts_obj != Py_None && take_counts(counts_obj, &b[1]) < 0) goto done;
    if (encode_into(b[0].v.buf, b[0].v.len / width, width, bits, bin_cost, node_cost, lanes, simd,
                    b[1].held ? b[1].v.buf : NULL, b[1].held ? b[1].v.len / 8 : 0, &g, 0) == 0)
        result = grow_finish(&g);
done:
    release(b, 2);
    Py_XDECREF(g.bytes);
    return result;
}

/* encode_stream(values, width, bits, bin_cost, node_cost, lanes, simd, block_log, counts=None) -> bytes
 * A whole `ans` stream as entropy.py's Ans._encode_blocks writes it: the
 * byte block_log (| WIDE_FLAG for wide lanes), then one block (block_log 0) or, per block of
 * 2^block_log values, its length as a varint and the block, in one bytes
 * object. `counts`: a sequence of each block's key counts (choose_block's), or None. */
static PyObject *rans_encode_stream(PyObject *self, PyObject *args) {
    PyObject *obj, *counts_obj = Py_None, *counts_seq = NULL;
    int width, bits, lanes, simd, block_log;
    double bin_cost, node_cost;
    if (!PyArg_ParseTuple(args, "Oiiddiii|O", &obj, &width, &bits, &bin_cost, &node_cost, &lanes, &simd, &block_log,
                          &counts_obj))
        return NULL;
    if (!encode_arguments_ok(width, bits, lanes)) return NULL;
    if (block_log < 0 || block_log > 40) {
        PyErr_SetString(PyExc_ValueError, "bad encode_stream arguments");
        return NULL;
    }
    buf_t b[1] = {{0}};
    grow_t g = {0};
    PyObject *result = NULL;
    if (take(obj, &b[0], 0, "values") < 0) goto done;
    Py_ssize_t n = b[0].v.len / width, size = block_log ? (Py_ssize_t)1 << block_log : n;
    if (n < 1) { PyErr_SetString(PyExc_ValueError, "an empty stream"); goto done; }
    Py_ssize_t blocks = (n + size - 1) / size;
    if (counts_obj != Py_None) {
        counts_seq = PySequence_Fast(counts_obj, "counts: a sequence of each block's counts");
        if (!counts_seq) goto done;
        if (PySequence_Fast_GET_SIZE(counts_seq) < blocks) {
            PyErr_SetString(PyExc_ValueError, "fewer counts than blocks");
            goto done;
        }
    }
    /* The stream about as long as the values (it is at most that, or the caller stores them raw instead). */
    if (grow_reserve(&g, (size_t)b[0].v.len / 8 * 9 + 64) < 0) goto done;
    PyBytes_AS_STRING(g.bytes)[g.pos++] = (char)((lanes == WIDE_LANES ? WIDE_FLAG : 0) | block_log);
    const uint8_t *values = b[0].v.buf;
    for (Py_ssize_t k = 0; k < blocks; k++) {
        Py_ssize_t first = k * size, count = n - first < size ? n - first : size;
        buf_t cb[1] = {{0}};
        if (counts_seq && take_counts(PySequence_Fast_GET_ITEM(counts_seq, k), &cb[0]) < 0) { release(cb, 1); goto done; }
        int status = encode_into(values + first * width, count, width, bits, bin_cost, node_cost, lanes, simd,
                                 cb[0].held ? cb[0].v.buf : NULL, cb[0].held ? cb[0].v.len / 8 : 0, &g, block_log != 0);
        release(cb, 1);
        if (status < 0) goto done;
    }
    result = grow_finish(&g);
done:
    release(b, 1);
    Py_XDECREF(counts_seq);
    Py_XDECREF(g.bytes);
    return result;
}

#define HIST_SPLIT_KEYS 1024  /* histograms this small are counted eight at a time (on the stack) */
#define HIST_WAYS 8

/* histogram(values, width, shift, keys, block_log) -> int64 counts
 * counts[block][key] of key = value >> shift (< keys) over blocks of
 * 2^block_log values (block_log 0: one block), blocks * keys of them. */
static PyObject *rans_histogram(PyObject *self, PyObject *args) {
    PyObject *obj;
    int width, shift, block_log;
    Py_ssize_t keys;
    if (!PyArg_ParseTuple(args, "Oiini", &obj, &width, &shift, &keys, &block_log)) return NULL;
    if ((width != 1 && width != 2 && width != 4) || shift < 0 || shift > 31 || keys < 1 || keys > (1 << 16)
        || block_log < 0 || block_log > 30) {
        PyErr_SetString(PyExc_ValueError, "bad histogram arguments");
        return NULL;
    }
    buf_t b[1] = {{0}};
    if (take(obj, &b[0], 0, "values") < 0) return NULL;
    Py_ssize_t n = b[0].v.len / width;
    Py_ssize_t blocks = block_log ? (n + ((Py_ssize_t)1 << block_log) - 1) >> block_log : 1;
    if (blocks < 1) blocks = 1;
    PyObject *result = PyBytes_FromStringAndSize(NULL, blocks * keys * 8);
    if (!result) { release(b, 1); return NULL; }
    int64_t *counts = (int64_t *)PyBytes_AS_STRING(result);
    memset(counts, 0, blocks * keys * 8);
    const void *values = b[0].v.buf;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    if (keys <= HIST_SPLIT_KEYS) {
        /* Eight histograms, value i in histogram i % 8, summed at each
         * block's end: a run of one key (a float's top bits) then does not
         * wait on its own counter (0.92 ns a BF16 value in cache in one,
         * 0.62 in four, 0.52 in eight). Keys checked only where a value
         * could lie past them. */
        uint32_t h[HIST_WAYS * HIST_SPLIT_KEYS];
        uint64_t widest = width == 4 ? 0xFFFFFFFFu : ((uint64_t)1 << (8 * width)) - 1;
        int checked = (widest >> shift) >= (uint64_t)keys;
        Py_ssize_t size = block_log ? (Py_ssize_t)1 << block_log : n;
        for (Py_ssize_t start = 0, b = 0; start < n && !bad; start += size, b++) {
            Py_ssize_t stop = start + size < n ? start + size : n, i = start;
            memset(h, 0, sizeof(uint32_t) * HIST_WAYS * (size_t)keys);
            uint32_t over = 0;
#define SPLIT(T) { const T *v = values; \
            if (checked) \
                for (Py_ssize_t j = i; j < stop; j++) over |= (uint32_t)(v[j] >> shift) >= (uint32_t)keys; \
            if (!over) { \
                for (; i + HIST_WAYS <= stop; i += HIST_WAYS) \
                    for (int w = 0; w < HIST_WAYS; w++) h[w * keys + (v[i + w] >> shift)]++; \
                for (; i < stop; i++) h[v[i] >> shift]++; \
            } }
            /* a byte's 256 keys (bytes, and 16-bit values' top bytes, which
             * choose_block counts): the ways' strides constant, the keys
             * unsigned (a runtime stride and a sign extension a value made
             * the loop twice as slow) */
#define SPLIT256(T, S) { const T *v = values; \
            for (; i + HIST_WAYS <= stop; i += HIST_WAYS) \
                for (int w = 0; w < HIST_WAYS; w++) h[w * 256u + (uint32_t)(v[i + w] >> (S))]++; \
            for (; i < stop; i++) h[(uint32_t)(v[i] >> (S))]++; }
            if (keys == 256 && width == 1 && shift == 0) SPLIT256(uint8_t, 0)
            else if (keys == 256 && width == 2 && shift == 8) SPLIT256(uint16_t, 8)
            else if (width == 1) SPLIT(uint8_t) else if (width == 2) SPLIT(uint16_t) else SPLIT(uint32_t)
#undef SPLIT256
#undef SPLIT
            if (over) { bad = 1; break; }
            int64_t *row = counts + b * keys;
            if (keys == 256 && size < ((Py_ssize_t)1 << 32))  /* constant strides: the ways summed in vectors */
                for (Py_ssize_t k = 0; k < 256; k++) {
                    uint32_t c = 0;  /* (a block's count: below 2^32) */
                    for (int w = 0; w < HIST_WAYS; w++) c += h[w * 256 + k];
                    row[k] = c;
                }
            else
                for (Py_ssize_t k = 0; k < keys; k++) {
                    int64_t c = 0;
                    for (int w = 0; w < HIST_WAYS; w++) c += h[w * keys + k];
                    row[k] = c;
                }
        }
    } else {
        for (Py_ssize_t i = 0; i < n; i++) {
            uint32_t key = load(values, width, i) >> shift;
            if ((Py_ssize_t)key >= keys) { bad = 1; break; }
            counts[(block_log ? (i >> block_log) : 0) * keys + key]++;
        }
    }
    Py_END_ALLOW_THREADS
    release(b, 1);
    if (bad) { Py_DECREF(result); PyErr_SetString(PyExc_ValueError, "a key is out of range"); return NULL; }
    return result;
}

/* numpy's sum of n doubles (numpy 2's pairwise_sum, which np.add.reduce
 * runs from 0.0 on a contiguous float64 array: fewer than 8 one by one;
 * up to 128 in eight running sums, combined as a tree, then the rest one
 * by one; more split in two at a multiple of 8 below the half). Here over
 * table[keys[i]], the gather numpy's take made. */
static double numpy_sum_of(const double *table, const int64_t *keys, Py_ssize_t n, Py_ssize_t live) {
    /* keys from `live` on are not read: they are 0, and table[0] is 0.0,
     * a term that changes no sum (every term is >= 0) */
    if (live <= 0) return 0.0;
#define TERM(I) ((I) < live ? table[keys[I]] : 0.0)
    if (n < 8) {
        double res = 0.0;
        for (Py_ssize_t i = 0; i < n; i++) res += TERM(i);
        return res;
    }
    if (n <= 128) {
        double r[8];
        for (int j = 0; j < 8; j++) r[j] = TERM(j);
        Py_ssize_t i = 8;
        for (; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += TERM(i + j);
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += TERM(i);
        return res;
    }
#undef TERM
    Py_ssize_t n2 = n / 2;
    n2 -= n2 % 8;
    return numpy_sum_of(table, keys, n2, live) + numpy_sum_of(table, keys + n2, n - n2, live - n2);
}

/* block_bits(hist, xlogx, keys, fine, logs, model_bits, live) -> bits of each block size
 * hist: int64 counts, rows x keys, a row per block of 2^fine values
 * (rows a whole number of the coarsest block's; those from `live` on are
 * zero: the padding, whose sums are skipped); for each log2 block size
 * L of logs (>= fine), with h the counts per block of 2^L (rows summed in
 * groups) and totals each block's sum: xlogx[totals].sum() -
 * xlogx[h].sum() + model_bits * count_nonzero(h), the doubles numpy gives
 * (choose_block's; its self-check compares them): 10 us on a sample
 * slice of 16,384 values, where numpy's dozen calls a block size took 58. */
__attribute__((optimize("fp-contract=off")))
static PyObject *rans_block_bits(PyObject *self, PyObject *args) {
    PyObject *ho, *to, *logs_o;
    int fine;
    double model_bits;
    Py_ssize_t keys, live = -1;
    if (!PyArg_ParseTuple(args, "OOniOd|n", &ho, &to, &keys, &fine, &logs_o, &model_bits, &live)) return NULL;
    PyObject *logs = PySequence_Fast(logs_o, "logs must be a sequence");
    if (!logs) return NULL;
    buf_t b[2] = {{0}};
    PyObject *result = NULL;
    int64_t *h = NULL, *totals = NULL;
    if (take(ho, &b[0], 0, "hist") < 0) goto done;
    if (take(to, &b[1], 0, "xlogx") < 0) goto done;
    Py_ssize_t cells = b[0].v.len / 8, top = b[1].v.len / 8, nlogs = PySequence_Fast_GET_SIZE(logs);
    if (keys < 1 || b[0].v.len % 8 || cells % keys || fine < 0 || fine > 30 || b[1].v.len % 8) {
        PyErr_SetString(PyExc_ValueError, "bad block_bits arguments");
        goto done;
    }
    Py_ssize_t rows = cells / keys;
    if (live < 0 || live > rows) live = rows;
    const int64_t *hist = b[0].v.buf;
    for (Py_ssize_t k = live * keys; k < cells; k++)
        if (hist[k]) {
            PyErr_SetString(PyExc_ValueError, "counts past the live rows");
            goto done;
        }
    const double *xlogx = b[1].v.buf;
    /* each level's counts from the level before's (rows summed in groups):
     * the same integers as from the fine rows */
    h = PyMem_Malloc(8 * (size_t)(cells ? cells : 1));
    totals = PyMem_Malloc(8 * (size_t)(rows ? rows : 1));
    result = PyTuple_New(nlogs);
    if (!h || !totals || !result) { Py_CLEAR(result); PyErr_NoMemory(); goto done; }
    const int64_t *prev = hist;  /* the level before's counts, prev_group fine rows a row, prev_live of them made */
    Py_ssize_t prev_group = 1, prev_live = live;
    for (Py_ssize_t j = 0; j < nlogs; j++) {
        long L = PyLong_AsLong(PySequence_Fast_GET_ITEM(logs, j));
        if (L == -1 && PyErr_Occurred()) { Py_CLEAR(result); goto done; }
        Py_ssize_t group = L >= fine && L - fine < 30 ? (Py_ssize_t)1 << (L - fine) : 0;
        if (!group || rows % group || group < prev_group) {
            Py_CLEAR(result);
            PyErr_SetString(PyExc_ValueError, "block sizes below the rows', not increasing, or not whole rows");
            goto done;
        }
        Py_ssize_t step = group / prev_group;  /* rows of the level before a row of this one */
        Py_ssize_t blocks = rows / group, nonzero = 0, live_blocks = (live + group - 1) / group;
        const int64_t *level = prev;
        if (step > 1) {  /* (in place: row r is made from rows r * step.. of the level before, read first) */
            for (Py_ssize_t r = 0; r < live_blocks; r++) {
                Py_ssize_t first = r * step, stop = first + step < prev_live ? first + step : prev_live;
                for (Py_ssize_t k = 0; k < keys; k++) {
                    int64_t c = 0;
                    for (Py_ssize_t g = first; g < stop; g++) c += prev[g * keys + k];
                    h[r * keys + k] = c;
                }
            }
            level = h;
        }
        int bad = 0;
        for (Py_ssize_t r = 0; r < live_blocks; r++) {  /* (the rest: zeros, never read) */
            const int64_t *row = level + r * keys;
            int64_t total = 0;
            for (Py_ssize_t k = 0; k < keys; k++) {
                total += row[k];
                nonzero += row[k] != 0;
                bad |= row[k] < 0 || row[k] >= top;
            }
            totals[r] = total;
            bad |= total < 0 || total >= top;
        }
        if (bad) {
            Py_CLEAR(result);
            PyErr_SetString(PyExc_ValueError, "a count past the xlogx table");
            goto done;
        }
        double a = 0.0 + numpy_sum_of(xlogx, totals, blocks, live_blocks);
        double c = 0.0 + numpy_sum_of(xlogx, level, blocks * keys, live_blocks * keys);
        double m = model_bits * (double)nonzero;
        double bits = a - c;
        bits = bits + m;
        PyObject *v = PyFloat_FromDouble(bits);
        if (!v) { Py_CLEAR(result); goto done; }
        PyTuple_SET_ITEM(result, j, v);
        prev = level;
        prev_group = group;
        prev_live = live_blocks;
    }
done:
    release(b, 2);
    PyMem_Free(h); PyMem_Free(totals);
    Py_DECREF(logs);
    return result;
}

/* lane_histogram(bytes, start, period) -> int64 counts, period x 256: how
 * often each byte value lies at each lane, byte i's lane being (start + i)
 * mod period (discovery.py's lane counts of a sample, for each block
 * layout it tries). One pass without the GIL, a row of `period` bytes at
 * a time from lane 0: within a row every byte counts in a lane of its own
 * (no increment waits on another to one counter), and no lane number is
 * carried from byte to byte. numpy's bincount of lane * 256 + byte made
 * that index array first: 1.0 ms a layout on a sample of 256 KiB, twelve
 * layouts a sample. */
static PyObject *rans_lane_histogram(PyObject *self, PyObject *args) {
    PyObject *obj;
    Py_ssize_t start, period;
    if (!PyArg_ParseTuple(args, "Onn", &obj, &start, &period)) return NULL;
    if (period < 1 || period > (1 << 16) || start < 0) {
        PyErr_SetString(PyExc_ValueError, "period must be in 1..65536 and start >= 0");
        return NULL;
    }
    buf_t b[1] = {{0}};
    if (take(obj, &b[0], 0, "bytes") < 0) return NULL;
    PyObject *result = PyBytes_FromStringAndSize(NULL, period * 256 * 8);
    if (!result) { release(b, 1); return NULL; }
    int64_t *counts = (int64_t *)PyBytes_AS_STRING(result);
    const uint8_t *x = b[0].v.buf;
    Py_ssize_t n = b[0].v.len, lane = start % period;
    if (n / period >= (Py_ssize_t)UINT32_MAX) {  /* a lane's counter would pass 32 bits */
        Py_DECREF(result); release(b, 1);
        PyErr_SetString(PyExc_ValueError, "too many bytes a lane");
        return NULL;
    }
    /* Counted byte-major, h[byte * period + lane], in 32 bits (a counter
     * counts at most one byte a row, n / period + 1 in all): a row of one
     * byte value touches consecutive counters, not counters 2 KiB apart
     * that share a few cache sets (zeros counted three times faster). */
    uint32_t *h = PyMem_RawCalloc((size_t)period * 256, sizeof(uint32_t));
    if (!h) { Py_DECREF(result); release(b, 1); return PyErr_NoMemory(); }
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t first = lane ? period - lane : 0;  /* bytes before the first whole row */
    if (first > n) first = n;
    for (Py_ssize_t i = 0; i < first; i++) h[x[i] * period + lane + i]++;
    const uint8_t *row = x + first;
    Py_ssize_t rows = (n - first) / period, tail = (n - first) % period;
    for (Py_ssize_t r = 0; r < rows; r++, row += period)
        for (Py_ssize_t i = 0; i < period; i++) h[row[i] * period + i]++;
    for (Py_ssize_t i = 0; i < tail; i++) h[row[i] * period + i]++;
    for (Py_ssize_t l = 0; l < period; l++)
        for (int v = 0; v < 256; v++) counts[l * 256 + v] = h[v * period + l];
    Py_END_ALLOW_THREADS
    PyMem_RawFree(h);
    release(b, 1);
    return result;
}

static int read_varint(const uint8_t *data, Py_ssize_t len, Py_ssize_t *pos, uint32_t *value) {
    uint32_t v = 0;
    for (int shift = 0; shift <= 28; shift += 7) {
        if (*pos >= len) return -1;
        uint8_t byte = data[(*pos)++];
        v |= (uint32_t)(byte & 0x7f) << shift;
        if (byte < 0x80) { *value = v; return 0; }
    }
    return -1;
}

typedef struct { uint32_t *firsts, *freqs; uint8_t *levels; } model_t;  /* 2^16 entries each */

/* A block's model (data, len: the block), checked as entropy.py's
 * _decode_block does: NULL, or what is wrong. Sets P, the bins, where the
 * rANS bytes start and their length. Needs no GIL. */
static const char *parse_model(const uint8_t *data, Py_ssize_t len, int key_bits, model_t *m, int *P,
                               Py_ssize_t *nbins_out, Py_ssize_t *pos_out, Py_ssize_t *length_out) {
    Py_ssize_t pos = 1, i = 0, nbins = 0, top = 0;
    Py_ssize_t stack[2 * 18];
    uint64_t total = 0;
    if (len < 1) return "empty block";
    int p = data[0];
    if (p < 1 || p > 16) return "precision out of range";
    stack[top++] = key_bits; stack[top++] = 0;
    while (top) {
        if (pos + i / 4 >= len) return "truncated trie";
        int code = (data[pos + i / 4] >> (2 * (i % 4))) & 3;
        i++;
        Py_ssize_t node = stack[--top];
        int level = (int)stack[--top];
        if (code == 2 && level) {
            stack[top++] = level - 1; stack[top++] = 2 * node + 1;
            stack[top++] = level - 1; stack[top++] = 2 * node;
        } else if (code == 1) {
            if (nbins >= (1 << 16)) return "too many bins";
            m->firsts[nbins] = (uint32_t)(node << level); m->levels[nbins++] = (uint8_t)level;
        } else if (code != 0) return "invalid trie code";
    }
    if (i % 4 && data[pos + i / 4] >> (2 * (i % 4))) return "trie padding is not zero";
    pos += (i + 3) / 4;
    if (nbins < 1 || nbins > ((Py_ssize_t)1 << p)) return "more bins than slots";
    for (Py_ssize_t r = 0; r < nbins; r++) {
        uint32_t f;
        if (read_varint(data, len, &pos, &f) < 0) return "truncated or overlong frequencies";
        if (f >= (1u << 16)) return "frequency out of range";
        m->freqs[r] = f + 1; total += f + 1;
    }
    if (total != ((uint64_t)1 << p)) return "frequencies do not sum to 2**P";
    uint32_t length;
    if (read_varint(data, len, &pos, &length) < 0) return "truncated length";
    if ((Py_ssize_t)length > len - pos) return "truncated";
    *P = p; *nbins_out = nbins; *pos_out = pos; *length_out = (Py_ssize_t)length;
    return NULL;
}

/* A whole `ans` stream (data, len: its block-size byte, WIDE_FLAG set where
 * its blocks are wide, then one block, or blocks of 2^B values each after
 * its varint length) of n >= 1 values of a
 * `bits`-bit field into out (n values of width bytes), checked as
 * entropy.py's Ans.decode does: NULL, or what is wrong. Needs no GIL. */
static const char *stream_decode(const uint8_t *data, Py_ssize_t len, Py_ssize_t n, int width, int bits,
                                 uint8_t *out, int simd, multi_t **multi, Py_ssize_t stream) {
    int shift = bits > 16 ? bits - 16 : 0, key_bits = bits - shift;
    /* scratch: the model of a block (at most 2^key_bits bins), its cumulative
     * and shifted forms; the slots, grown to the largest P met */
    size_t most = (size_t)1 << key_bits;
    uint8_t *scratch = PyMem_RawMalloc(most * (4 * 4 + 2));
    if (!scratch) return "out of memory";
    model_t m = {(uint32_t *)scratch, (uint32_t *)(scratch + 4 * most), scratch + 16 * most};
    uint32_t *cum = (uint32_t *)(scratch + 8 * most), *lower = (uint32_t *)(scratch + 12 * most);
    uint8_t *obits = scratch + 17 * most;
    uint16_t *slots = NULL;
    uint32_t *packed = NULL;
    int slots_log = -1;
    const char *error = NULL;
    if (len < 1) error = "empty stream";
    else {
        int wide = data[0] & WIDE_FLAG, block_log = data[0] & ~WIDE_FLAG;
        Py_ssize_t pos = 1, size = block_log ? (Py_ssize_t)1 << block_log : n;
        if (block_log && (block_log < MIN_BLOCK_LOG || block_log > MAX_BLOCK_LOG)) error = "block size out of range";
        for (Py_ssize_t start = 0; !error && start < n; start += size) {
            Py_ssize_t count = n - start < size ? n - start : size, blen = len - pos;
            if (block_log) {
                uint32_t length;
                if (read_varint(data, len, &pos, &length) < 0) { error = "truncated block length"; break; }
                if ((Py_ssize_t)length > len - pos) { error = "truncated block"; break; }
                blen = length;
            }
            const uint8_t *block = data + pos;
            if (!blen) { error = "empty block"; break; }
            int P;
            Py_ssize_t nbins, mpos, rlen;
            error = parse_model(block, blen, key_bits, &m, &P, &nbins, &mpos, &rlen);
            if (error) break;
            if (P > slots_log) {
                uint16_t *grown = PyMem_RawRealloc(slots, sizeof(uint16_t) << P);
                if (grown) slots = grown;
                uint32_t *more = PyMem_RawRealloc(packed, 3 * sizeof(uint32_t) << P);  /* etab (2 words a slot), wtab */
                if (more) packed = more;
                if (!grown || !more) { error = "out of memory"; break; }
                slots_log = P;
            }
            uint32_t total = 0;
            for (Py_ssize_t r = 0; r < nbins; r++) {
                cum[r] = total; total += m.freqs[r];
                lower[r] = m.firsts[r] << shift;
                obits[r] = (uint8_t)(m.levels[r] + shift);
            }
            /* a narrow block long enough for a slot of the engine for its width (multi[width / 2]);
             * `spare`: the stream's bytes after the block (narrow_t), at most SPARE_MOST */
            Py_ssize_t spare = len - pos - blen < SPARE_MOST ? len - pos - blen : SPARE_MOST;
            multi_t *engine = NULL;
            if (!wide && multi && P <= 15 && count >= MULTI_MIN
                    && 8 * ((uint64_t)(blen - mpos - rlen + spare) + MULTI_OFFSET_READS) < ((uint64_t)1 << 31)) {
                if (!multi[width >> 1]) multi[width >> 1] = multi_new(width, simd);
                engine = multi[width >> 1];  /* none where memory ran out: decoded now */
                if (engine && !multi_fits(engine, block + mpos + rlen, blen - mpos - rlen + spare)) engine = NULL;
            }
            if (engine) {
                error = check_model(m.freqs, cum, obits, nbins, P, width);
                if (!error)
                    error = multi_add(engine, block + mpos, rlen, block + mpos + rlen, blen - mpos - rlen, spare, count,
                                      out + start * width, m.freqs, lower, obits, nbins, P, shift, stream);
            } else if (wide)
                error = decode_wide(block + mpos, rlen, block + mpos + rlen, blen - mpos - rlen, count, width, bits, m.freqs,
                                    cum, lower, obits, nbins, P, out + start * width, slots, (uint64_t *)packed,
                                    packed + ((size_t)2 << slots_log), simd);
            else
                error = decode_core(block + mpos, rlen, block + mpos + rlen, blen - mpos - rlen, spare, count, width, m.freqs,
                                    cum, lower, obits, nbins, P, out + start * width, slots, (uint64_t *)packed,
                                    shift, simd);
            pos += blen;
        }
        if (!error && pos != len) error = block_log ? "bytes after the last block" : "damaged stream";
    }
    PyMem_RawFree(scratch);
    PyMem_RawFree(slots);
    PyMem_RawFree(packed);
    return error;
}

/* One decode call's arguments: the stream's and the output's buffers (held
 * once take_call succeeds), the values' count, width and bits; for
 * decode_streams, the stream's expected check (-1: none) and the decoded
 * bytes' expected digest (has_digest: 16 bytes). */
typedef struct { buf_t b[2]; Py_ssize_t n; int width, bits; long long check; int has_digest; uint8_t digest[16]; } call_t;

/* Check a call's n, width and bits (set in c) and take its buffers: 0, or
 * -1 with the exception set (the caller releases c->b either way). */
static int take_call(PyObject *stream, PyObject *out, call_t *c) {
    int raw = c->width == 0 && c->bits == 0;  /* bytes stored as they are (the `raw` leaf): n bytes */
    if (c->n < 1 || (!raw && ((c->width != 1 && c->width != 2 && c->width != 4) || c->bits < 1 || c->bits > 8 * c->width))) {
        PyErr_SetString(PyExc_ValueError, "width must be 1, 2 or 4 and bits in 1..8*width (both 0: raw), n >= 1");
        return -1;
    }
    if (take(stream, &c->b[0], 0, "stream") < 0 || take(out, &c->b[1], 1, "out") < 0) return -1;
    if (c->b[1].v.len != c->n * (raw ? 1 : c->width)) {
        PyErr_SetString(PyExc_ValueError, "output has the wrong size");
        return -1;
    }
    return 0;
}

/* A call's order in decode_calls: its narrow blocks' length (a stream's
 * blocks have one length but the last), longest first; then position. */
typedef struct { Py_ssize_t block, pos; } call_order_t;

static int by_block_length(const void *a, const void *b) {
    const call_order_t *x = a, *y = b;
    if (x->block != y->block) return x->block > y->block ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

/* stream_decode for each of `count` calls, their narrow blocks through
 * the engines (one per width) where the CPU has AVX2 and `simd` is set:
 * NULL, or what is wrong with the first stream (by position) that does not
 * decode, its position in *failed. A stream whose blocks do not parse or
 * start ends the streams after it; blocks in the engines are finished
 * first. With the engines, the streams of longer blocks go first: a block
 * that outlasts the others is finished alone, one value at a time, so the
 * engine's last blocks had better be short ones (pocketnet: one in ten
 * values was). Needs no GIL. */
static const char *decode_calls(call_t *calls, Py_ssize_t count, int simd, Py_ssize_t *failed) {
    multi_t *multi[3] = {NULL, NULL, NULL};
    int engines = 0;
    call_order_t *order = NULL;
    if (multi_usable(simd)) {  /* only where there are blocks enough to share the kernel's calls */
        Py_ssize_t blocks = 0;
        order = count > 1 ? PyMem_RawMalloc(sizeof(call_order_t) * (size_t)count) : NULL;
        for (Py_ssize_t j = 0; j < count; j++) {
            const uint8_t *data = calls[j].b[0].v.buf;
            Py_ssize_t size = 0;
            if (calls[j].width && calls[j].b[0].v.len && !(data[0] & WIDE_FLAG)) {
                int block_log = data[0] & ~WIDE_FLAG;
                Py_ssize_t n = calls[j].n;
                size = block_log && block_log <= MAX_BLOCK_LOG ? (Py_ssize_t)1 << block_log : n;
                if (size > n) size = n;
                if (size >= MULTI_MIN) blocks += n / size;
            }
            if (order) { order[j].block = size; order[j].pos = j; }
        }
        engines = blocks >= 3;
        if (engines && order) qsort(order, (size_t)count, sizeof *order, by_block_length);
    }
    const char *error = NULL;
    *failed = -1;
    for (Py_ssize_t k = 0; k < count; k++) {
        Py_ssize_t j = engines && order ? order[k].pos : k;
        if (*failed >= 0 && j > *failed) continue;  /* after a stream found damaged: not needed */
        call_t *c = &calls[j];
        const char *e = NULL;
        if (!c->width) {  /* raw: the stream is the bytes */
            if (c->b[0].v.len != c->n) e = "raw stream has the wrong length";
            else memcpy(c->b[1].v.buf, c->b[0].v.buf, (size_t)c->n);
        } else
            e = stream_decode(c->b[0].v.buf, c->b[0].v.len, c->n, c->width, c->bits, c->b[1].v.buf, simd,
                              engines ? multi : NULL, j);
        if (e) { error = e; *failed = j; }
    }
    PyMem_RawFree(order);
    for (int w = 0; w < 3; w++) {
        if (!multi[w]) continue;
        multi_run(multi[w], 1);
        if (multi[w]->failed >= 0 && (*failed < 0 || multi[w]->failed < *failed)) {
            *failed = multi[w]->failed;
            error = multi[w]->error;
        }
        multi_free(multi[w]);
    }
    return error;
}

/* decode_stream(stream, n, width, bits, out, simd=1) -> None: stream_decode,
 * the GIL released; simd=0: wide blocks without the AVX2 kernel, narrow ones
 * without BMI2; simd=2: the AVX2 kernels' AVX2 builds where the CPU has
 * AVX-512 too; simd=3: their AVX-512 builds, not the 512-bit wide kernel
 * (tests). */
static PyObject *rans_decode_stream(PyObject *self, PyObject *args) {
    PyObject *o[2];
    call_t c = {{{0}}};
    int simd = 1;
    if (!PyArg_ParseTuple(args, "OniiO|i", &o[0], &c.n, &c.width, &c.bits, &o[1], &simd)) return NULL;
    if (take_call(o[0], o[1], &c) < 0) { release(c.b, 2); return NULL; }
    const char *error;
    Py_ssize_t failed;
    Py_BEGIN_ALLOW_THREADS
    error = decode_calls(&c, 1, simd, &failed);
    Py_END_ALLOW_THREADS
    release(c.b, 2);
    if (!error) Py_RETURN_NONE;
    PyErr_SetString(PyExc_ValueError, error);
    return NULL;
}

/* A stored stream's check (format.stream_check): the low 32 bits of its XXH3-64. */
static uint32_t check_of(const void *data, size_t n) {
    return (uint32_t)XXH3_64bits(data, n);
}

/* A chunk's digest (format.chunk_digest from version 7 on): its XXH3-128,
 * canonical (big-endian, as xxhash.xxh3_128_digest gives it). */
static void digest_of(const void *data, size_t n, uint8_t digest[16]) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(data, n));
    memcpy(digest, c.digest, 16);
}

/* check(data) -> int, or with `digest` digest(data) -> 16 bytes, the GIL
 * released on data of 64 KiB or more (below, handing it over costs more). */
static PyObject *hashed(PyObject *args, int digest) {
    Py_buffer v;
    if (!PyArg_ParseTuple(args, "y*", &v)) return NULL;
    uint8_t d[16];
    uint32_t h = 0;
    PyThreadState *released = v.len >= (1 << 16) ? PyEval_SaveThread() : NULL;
    if (digest) digest_of(v.buf, (size_t)v.len, d);
    else h = check_of(v.buf, (size_t)v.len);
    if (released) PyEval_RestoreThread(released);
    PyBuffer_Release(&v);
    return digest ? PyBytes_FromStringAndSize((const char *)d, 16) : PyLong_FromUnsignedLong(h);
}

static PyObject *rans_check(PyObject *self, PyObject *args) { return hashed(args, 0); }
static PyObject *rans_digest(PyObject *self, PyObject *args) { return hashed(args, 1); }

/* decode_streams(items) -> None or (k, message, kind): decode_stream for
 * each (stream, n, width, bits, out[, check, digest]) of a list, the GIL
 * released once for all of them: threads decoding many small chunks
 * otherwise hand the GIL over at every one. Width and bits 0: the stream
 * holds the n bytes as they are (the `raw` leaf), copied into out. `check` (an int, or -1): the
 * stream's expected format.stream_check, compared before anything decodes;
 * `digest` (16 bytes, or None): the decoded bytes' expected XXH3-128,
 * compared once all have decoded. The first failure of the first kind met,
 * by position in the list: kind 1 a stream does not match its check, 0 it
 * does not decode (the message says why), 2 its bytes do not match their
 * digest. Bad arguments raise as decode_stream's. */
static PyObject *rans_decode_streams(PyObject *self, PyObject *args) {
    PyObject *list;
    if (!PyArg_ParseTuple(args, "O!", &PyList_Type, &list)) return NULL;
    Py_ssize_t count = PyList_GET_SIZE(list);
    call_t *calls = PyMem_Calloc(count ? count : 1, sizeof(call_t));
    if (!calls) return PyErr_NoMemory();
    PyObject *result = NULL;
    Py_ssize_t k = 0;
    for (; k < count; k++) {
        PyObject *o[2], *digest = Py_None;
        call_t *c = &calls[k];
        c->check = -1;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(list, k), "OniiO|LO", &o[0], &c->n, &c->width, &c->bits, &o[1],
                              &c->check, &digest)
                || take_call(o[0], o[1], c) < 0)
            goto done;
        if (c->check > 0xffffffffLL) { PyErr_SetString(PyExc_ValueError, "a check is 32 bits"); goto done; }
        if (digest != Py_None) {
            if (!PyBytes_Check(digest) || PyBytes_GET_SIZE(digest) != 16) {
                PyErr_SetString(PyExc_ValueError, "a digest is 16 bytes");
                goto done;
            }
            memcpy(c->digest, PyBytes_AS_STRING(digest), 16);
            c->has_digest = 1;
        }
    }
    const char *error = NULL;
    Py_ssize_t failed = -1;
    int kind = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < count && !error; j++) {
        const Py_buffer *stream = &calls[j].b[0].v;
        if (calls[j].check >= 0 && check_of(stream->buf, (size_t)stream->len) != (uint32_t)calls[j].check) {
            error = "stream does not match its check"; failed = j; kind = 1;
        }
    }
    if (!error) error = decode_calls(calls, count, 1, &failed);
    for (Py_ssize_t j = 0; j < count && !error; j++) {
        uint8_t got[16];
        if (!calls[j].has_digest) continue;
        digest_of(calls[j].b[1].v.buf, (size_t)calls[j].b[1].v.len, got);
        if (memcmp(got, calls[j].digest, 16)) { error = "decoded bytes do not match their digest"; failed = j; kind = 2; }
    }
    Py_END_ALLOW_THREADS
    if (error) result = Py_BuildValue("(nsi)", failed, error, kind);
    else { Py_INCREF(Py_None); result = Py_None; }
done:
    for (Py_ssize_t j = 0; j < count && j <= k; j++) release(calls[j].b, 2);
    PyMem_Free(calls);
    return result;
}

/* counts(values, width) -> (sum of c * log2(c) over the distinct values, distinct)
 * for values of at most 16 bits: the plug-in entropy's parts, with no
 * 2^16 array per call (the search asks it of every sample value). */
static PyObject *rans_counts(PyObject *self, PyObject *args) {
    PyObject *obj;
    int width;
    if (!PyArg_ParseTuple(args, "Oi", &obj, &width)) return NULL;
    if (width != 1 && width != 2) { PyErr_SetString(PyExc_ValueError, "width must be 1 or 2"); return NULL; }
    buf_t b[1] = {{0}};
    if (take(obj, &b[0], 0, "values") < 0) return NULL;
    Py_ssize_t n = b[0].v.len / width, d = 0;
    const void *values = b[0].v.buf;
    if (width == 1) {  /* at most 256 keys: the branch on a key's first value soon always goes one way */
        for (Py_ssize_t i = 0; i < n; i++) {
            uint32_t key = ((const uint8_t *)values)[i];
            if (!key_counts[key]++) key_ids[d++] = key;
        }
    } else {  /* thousands of keys: each listed at its first value without a branch (the branch
               * mispredicted on every new key: an F16 sample's counts 2.4x faster, BF16's 1.3-2x) */
        for (Py_ssize_t i = 0; i < n; i++) {
            uint32_t key = ((const uint16_t *)values)[i];
            key_ids[d] = key;
            d += !key_counts[key]++;
        }
    }
    release(b, 1);
    double sum = 0.0;
    for (Py_ssize_t j = 0; j < d; j++) { sum += xlogx(key_counts[key_ids[j]]); key_counts[key_ids[j]] = 0; }
    return Py_BuildValue("(dn)", sum, d);
}

/* simd() -> bool: whether wide blocks decode with the AVX2 kernel here. */
static PyObject *rans_simd(PyObject *self, PyObject *args) { return PyBool_FromLong(wide_simd_usable()); }

static PyMethodDef methods[] = {
    {"counts", rans_counts, METH_VARARGS, "counts(values, width) -> (sum c*log2(c), distinct)"},
    {"histogram", rans_histogram, METH_VARARGS, "histogram(values, width, shift, keys, block_log) -> int64 counts"},
    {"block_bits", rans_block_bits, METH_VARARGS, "block_bits(hist, xlogx, keys, fine, logs, model_bits, live=rows) -> bits of each block size (choose_block's)"},
    {"lane_histogram", rans_lane_histogram, METH_VARARGS, "lane_histogram(bytes, start, period) -> int64 counts, period x 256"},
    {"trie_values", rans_trie_values, METH_VARARGS, "trie_values(values, width, shift, key_bits, bin_cost, node_cost)"},
    {"trie_cost", rans_trie_cost, METH_VARARGS, "trie_cost(values, width, shift, key_bits, bin_cost, node_cost) -> (bins, codes, bits)"},
    {"key_counts", rans_key_counts, METH_VARARGS, "key_counts(values, width) -> (distinct values as uint32, their counts as int64)"},
    {"encode_block", rans_encode_block, METH_VARARGS, "encode_block(values, width, bits, bin_cost, node_cost, lanes=4, simd=1, counts=None) -> bytes"},
    {"encode_stream", rans_encode_stream, METH_VARARGS,
     "encode_stream(values, width, bits, bin_cost, node_cost, lanes, simd, block_log, counts=None) -> bytes"},
    {"decode_stream", rans_decode_stream, METH_VARARGS, "decode_stream(stream, n, width, bits, out, simd=1) -> None"},
    {"decode_streams", rans_decode_streams, METH_VARARGS,
     "decode_streams([(stream, n, width, bits, out[, check, digest]), ...]) -> None or (k, error, kind)"},
    {"digest", rans_digest, METH_VARARGS, "digest(data) -> XXH3-128 of data, 16 bytes, big-endian"},
    {"check", rans_check, METH_VARARGS, "check(data) -> the low 32 bits of XXH3-64 of data"},
    {"simd", rans_simd, METH_NOARGS, "simd() -> whether wide blocks decode with AVX2 here"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rans", "Binned interleaved rANS loops.", -1, methods};

PyMODINIT_FUNC PyInit__rans(void) {
#ifdef HAVE_WIDE_AVX2
    for (int m = 0; m < 256; m++) {
        int count = __builtin_popcount(m), j = 0;
        memset(wide_pack[m], 0x80, 16);  /* zeros below the words */
        for (int k = 0; k < 8; k++)
            if ((m >> k) & 1) {
                wide_pack[m][2 * (8 - count + j)] = (uint8_t)(2 * k);
                wide_pack[m][2 * (8 - count + j) + 1] = (uint8_t)(2 * k + 1);
                j++;
            }
    }
#endif
    for (int m = 0; m < 256; m++)
        for (int k = 0, c = 0; k < 8; k++) { wide_perm[m][k] = c; c += (m >> k) & 1; }
    for (int m = 0; m < 256; m++)
        for (int k = 0; k < 8; k++)
            multi_perm[m][k] = k < 4 ? __builtin_popcount(m & 15 & ((1 << k) - 1))
                                     : 4 + __builtin_popcount((m >> 4) & ((1 << (k - 4)) - 1));
    if (!xlogx_ready) {
        xlogx_table[0] = 0.0;
        for (int c = 1; c < XLOGX_TABLE; c++) xlogx_table[c] = (double)c * log2((double)c);
        xlogx_ready = 1;
    }
    if (!kept_lock) kept_lock = PyThread_allocate_lock();  /* none: arenas are not kept */
    return PyModule_Create(&module);
}
