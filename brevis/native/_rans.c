/* Binned interleaved rANS: the hot loops of the `ans` coder (brevis/dsl/entropy.py).
 *
 * A value is coded as its bin (rANS, four 32-bit states taking the values in
 * turn, value i in state i % 4, renormalized by 16-bit words) and its offset
 * in the bin (the value's low obits[bin] bits, in a separate little-endian
 * bit stream). The model (bins, frequencies summing to 2^P, P <= 16) is
 * built, stored and checked in Python. The encoder runs backwards and writes
 * words towards the front of its buffer; the decoder reads the four final
 * states, then the words front to back. A decoder that would read past
 * either stream, or does not end on the encoder's initial states with every
 * word and every whole byte of offsets consumed, reports a damaged stream.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define LANES 4
#define RANS_L (1u << 16)

typedef struct { Py_buffer v; int held; } buf_t;
typedef struct { uint32_t freq, cum, lower, obits; } bin_t;

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

/* encode(ranks, values, width, freq, cum, lower, obits, P) -> (rans bytes, offset bytes)
 * ranks: uint16 bin of each value; values: width (1, 2, 4) bytes each;
 * freq, cum, lower: uint32 per bin; obits: uint8 per bin. */
static PyObject *rans_encode(PyObject *self, PyObject *args) {
    PyObject *o[7];
    int width, P;
    if (!PyArg_ParseTuple(args, "OOiOOOOi", &o[0], &o[1], &width, &o[2], &o[3], &o[4], &o[5], &P)) return NULL;
    if ((width != 1 && width != 2 && width != 4) || P < 1 || P > 16) {
        PyErr_SetString(PyExc_ValueError, "width must be 1, 2 or 4 and P in 1..16");
        return NULL;
    }
    buf_t b[6] = {{0}};
    const char *names[6] = {"ranks", "values", "freq", "cum", "lower", "obits"};
    for (int i = 0; i < 6; i++) if (take(o[i], &b[i], 0, names[i]) < 0) { release(b, 6); return NULL; }
    PyObject *result = NULL;
    Py_ssize_t n = b[0].v.len / 2, bins = b[2].v.len / 4;
    if (b[1].v.len != n * width || b[3].v.len != bins * 4 || b[4].v.len != bins * 4 || b[5].v.len != bins) {
        PyErr_SetString(PyExc_ValueError, "arrays disagree in length");
        release(b, 6);
        return NULL;
    }
    const uint16_t *ranks = b[0].v.buf;
    const void *values = b[1].v.buf;
    const uint32_t *freq = b[2].v.buf, *cum = b[3].v.buf, *lower = b[4].v.buf;
    const uint8_t *obits = b[5].v.buf;
    size_t cap = (size_t)n * 2 + 2;
    uint16_t *words = PyMem_Malloc(cap * 2);
    uint8_t *offs = PyMem_Malloc((size_t)n * 4 + 8);
    int bad = 0;
    size_t nwords = 0, noffs = 0;
    uint32_t x[LANES];
    if (!words || !offs) { PyErr_NoMemory(); goto done; }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {  /* offsets, forwards */
        uint32_t r = ranks[i], v = load(values, width, i);
        if ((Py_ssize_t)r >= bins || obits[r] > 32) { bad = 1; break; }
        uint32_t w = obits[r];
        uint32_t off = w == 32 ? v - lower[r] : v - lower[r];
        if (w < 32 && (off >> w)) { bad = 1; break; }
        (void)off;
    }
    if (!bad) {
        uint64_t acc = 0; int fill = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            uint32_t r = ranks[i], w = obits[r];
            uint64_t off = (uint64_t)(load(values, width, i) - lower[r]);
            acc |= off << fill; fill += w;
            while (fill >= 8) { offs[noffs++] = (uint8_t)acc; acc >>= 8; fill -= 8; }
        }
        if (fill) offs[noffs++] = (uint8_t)acc;
        uint16_t *end = words + cap, *ptr = end;
        for (int k = 0; k < LANES; k++) x[k] = RANS_L;
        for (Py_ssize_t i = n - 1; i >= 0; i--) {  /* bins, backwards */
            uint32_t r = ranks[i], f = freq[r];
            uint32_t *xs = &x[i & (LANES - 1)];
            if (!f) { bad = 1; break; }
            uint64_t x_max = ((uint64_t)1 << (32 - P)) * f;
            if (*xs >= x_max) { *--ptr = (uint16_t)(*xs & 0xffff); *xs >>= 16; }
            *xs = ((*xs / f) << P) + (*xs % f) + cum[r];
        }
        nwords = (size_t)(end - ptr);
        memmove(words, ptr, nwords * 2);
    }
    Py_END_ALLOW_THREADS
    if (bad) { PyErr_SetString(PyExc_ValueError, "a value lies outside its bin"); goto done; }
    PyObject *rans = PyBytes_FromStringAndSize(NULL, 4 * LANES + nwords * 2);
    if (!rans) goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(rans);
    for (int k = 0; k < LANES; k++)
        for (int j = 0; j < 4; j++) out[4 * k + j] = (uint8_t)(x[k] >> (8 * j));
    for (size_t w = 0; w < nwords; w++) {  /* little-endian on every host */
        out[4 * LANES + 2 * w] = (uint8_t)(words[w] & 0xff);
        out[4 * LANES + 2 * w + 1] = (uint8_t)(words[w] >> 8);
    }
    PyObject *offsets = PyBytes_FromStringAndSize((const char *)offs, noffs);
    if (!offsets) { Py_DECREF(rans); goto done; }
    result = PyTuple_Pack(2, rans, offsets);
    Py_DECREF(rans); Py_DECREF(offsets);
done:
    PyMem_Free(words); PyMem_Free(offs);
    release(b, 6);
    return result;
}

/* decode(rans, offsets, n, width, freq, cum, lower, obits, P, out) -> None
 * The bins in cumulative order, frequencies summing to 2^P; out: n values
 * of width bytes. */
static PyObject *rans_decode(PyObject *self, PyObject *args) {
    PyObject *o[7];
    Py_ssize_t n;
    int width, P;
    if (!PyArg_ParseTuple(args, "OOniOOOOiO", &o[0], &o[1], &n, &width, &o[2], &o[3], &o[4], &o[5], &P, &o[6]))
        return NULL;
    if ((width != 1 && width != 2 && width != 4) || P < 1 || P > 16 || n < 0) {
        PyErr_SetString(PyExc_ValueError, "width must be 1, 2 or 4, P in 1..16, n >= 0");
        return NULL;
    }
    buf_t b[7] = {{0}};
    const char *names[7] = {"rans", "offsets", "freq", "cum", "lower", "obits", "out"};
    for (int i = 0; i < 7; i++) if (take(o[i], &b[i], i == 6, names[i]) < 0) { release(b, 7); return NULL; }
    const char *error = NULL;
    uint16_t *slots = NULL;
    bin_t *table = NULL;
    Py_ssize_t bins = b[2].v.len / 4;
    uint32_t M = 1u << P;
    if (b[3].v.len != bins * 4 || b[4].v.len != bins * 4 || b[5].v.len != bins || bins < 1 || bins > (Py_ssize_t)M
        || bins > 65536) { error = "bad model"; goto done; }
    if (b[6].v.len != n * width) { error = "output has the wrong size"; goto done; }
    if (b[0].v.len < 4 * LANES || (b[0].v.len - 4 * LANES) % 2) { error = "damaged stream (length)"; goto done; }
    const uint32_t *freq = b[2].v.buf, *cum = b[3].v.buf, *lower = b[4].v.buf;
    const uint8_t *obits = b[5].v.buf;
    slots = PyMem_Malloc(sizeof(uint16_t) * M);
    table = PyMem_Malloc(sizeof(bin_t) * bins);
    if (!slots || !table) { PyErr_NoMemory(); goto done; }
    uint32_t total = 0;
    for (Py_ssize_t r = 0; r < bins; r++) {
        if (freq[r] == 0 || cum[r] != total || freq[r] > M - total || obits[r] > 8 * width) { error = "bad model"; goto done; }
        for (uint32_t j = 0; j < freq[r]; j++) slots[total + j] = (uint16_t)r;
        table[r].freq = freq[r]; table[r].cum = cum[r]; table[r].lower = lower[r]; table[r].obits = obits[r];
        total += freq[r];
    }
    if (total != M) { error = "bad model"; goto done; }
    const uint8_t *in = b[0].v.buf;
    uint32_t x[LANES];
    for (int k = 0; k < LANES; k++)
        x[k] = (uint32_t)in[4 * k] | (uint32_t)in[4 * k + 1] << 8 | (uint32_t)in[4 * k + 2] << 16 | (uint32_t)in[4 * k + 3] << 24;
    const uint8_t *ptr = in + 4 * LANES, *end = in + b[0].v.len;
    const uint8_t *op = b[1].v.buf, *oend = op + b[1].v.len;
    uint8_t *o8 = b[6].v.buf;
    uint16_t *o16 = b[6].v.buf;
    uint32_t *o32 = b[6].v.buf;
    uint32_t mask = M - 1;
    uint64_t acc = 0;
    int fill = 0, bad = 0;
    const uint8_t *ostart = op;
    Py_BEGIN_ALLOW_THREADS
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
                    acc |= (uint64_t)((uint32_t)op[0] | (uint32_t)op[1] << 8 | (uint32_t)op[2] << 16 | (uint32_t)op[3] << 24) << fill; \
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
    /* Fast path, while every stream holds more than four values can read:
     * renormalization without a branch, offsets refilled 32 bits at a time. */
#define FAST(X, I, OUT) { \
        uint32_t slot = X & mask; const bin_t *bn = &table[slots[slot]]; \
        X = bn->freq * (X >> P) + slot - bn->cum; \
        uint32_t need = X < RANS_L, word = (uint32_t)ptr[0] | (uint32_t)ptr[1] << 8; \
        X = need ? (X << 16) | word : X; ptr += need << 1; \
        if (fill < 32) { \
            acc |= (uint64_t)((uint32_t)op[0] | (uint32_t)op[1] << 8 | (uint32_t)op[2] << 16 | (uint32_t)op[3] << 24) << fill; \
            op += 4; fill += 32; \
        } \
        uint32_t w = bn->obits; \
        OUT[I] = bn->lower + (uint32_t)(acc & (((uint64_t)1 << w) - 1)); acc >>= w; fill -= w; \
    }
#define FAST_LOOP(OUT) \
    for (; i + LANES <= n && end - ptr >= 2 * LANES && oend - op >= 4 * LANES; i += LANES) { \
        FAST(x0, i, OUT) FAST(x1, i + 1, OUT) FAST(x2, i + 2, OUT) FAST(x3, i + 3, OUT) \
    }
    if (!bad) {
        if (width == 1) { FAST_LOOP(o8) } else if (width == 2) { FAST_LOOP(o16) } else { FAST_LOOP(o32) }
    }
#undef FAST_LOOP
#undef FAST
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
    (void)ostart;
    if (!bad) {
        if (x0 != RANS_L || x1 != RANS_L || x2 != RANS_L || x3 != RANS_L) bad = 1;
        if (ptr != end || op != oend || fill >= 8 || acc) bad = 1;
    }
    Py_END_ALLOW_THREADS
    if (bad) error = "damaged stream";
done:
    if (error) PyErr_SetString(PyExc_ValueError, error);
    PyMem_Free(slots);
    PyMem_Free(table);
    release(b, 7);
    if (error || PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"encode", rans_encode, METH_VARARGS, "encode(ranks, values, width, freq, cum, lower, obits, P) -> (rans, offsets)"},
    {"decode", rans_decode, METH_VARARGS, "decode(rans, offsets, n, width, freq, cum, lower, obits, P, out) -> None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rans", "Binned interleaved rANS loops.", -1, methods};

PyMODINIT_FUNC PyInit__rans(void) { return PyModule_Create(&module); }
