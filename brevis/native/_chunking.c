/* Content-defined anchors and pieces for the repeat search
 * (brevis/formats/repeats.py).
 *
 * anchors(data, bits) -> bytes: the offsets i + 8 (int64, ascending) of the
 * 8-byte windows data[i:i+8] whose hash, h = (w ^ w >> 29) * K with w the
 * little-endian word, has its top `bits` bits clear. The same function as
 * repeats.anchors in numpy, which made eight passes over the data for each
 * of the eight window phases (80 MB/s here); one pass here. pieces()
 * scans for them itself; anchors() exposes the same scan (find_anchors)
 * for the tests to hold to numpy's.
 *
 * pieces(data, bits, least, most, final) -> (ends, keys): the pieces
 * repeats.pieces cuts a block into (repeats._cuts over its anchors) and
 * each one's key, the XXH3-64 of its bytes; where repeats._cuts and a
 * hash call a piece cost 1-2 us of Python each (mediapipe's 29 MB, 375k
 * pieces: 1.4 s of 11.7 s compressing).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#define XXH_INLINE_ALL
#include "xxhash/xxhash.h"

#define K 0x9E3779B97F4A7C15ULL

/* The anchors of d[0:len) (see anchors) into a malloc'ed array; NULL where memory ran out. */
static int64_t *find_anchors(const uint8_t *d, Py_ssize_t len, int bits, Py_ssize_t *count_out) {
    Py_ssize_t n = len - 7, cap = 1024, count = 0;
    int64_t *out = malloc(cap * sizeof(int64_t));
    if (!out) return NULL;
    int shift = 64 - bits;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t w;
        memcpy(&w, d + i, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        w = __builtin_bswap64(w);  /* the word is read little-endian, as numpy's "<u8" */
#endif
        uint64_t h = (w ^ (w >> 29)) * K;
        if ((h >> shift) == 0) {
            if (count == cap) {
                int64_t *grown = realloc(out, 2 * cap * sizeof(int64_t));
                if (!grown) { free(out); return NULL; }
                out = grown;
                cap *= 2;
            }
            out[count++] = i + 8;
        }
    }
    *count_out = count;
    return out;
}

static PyObject *chunking_anchors(PyObject *self, PyObject *args) {
    Py_buffer b;
    int bits;
    if (!PyArg_ParseTuple(args, "y*i", &b, &bits)) return NULL;
    if (bits < 1 || bits > 63) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "bits must be 1 to 63");
        return NULL;
    }
    const uint8_t *d = b.buf;
    Py_ssize_t count = 0;
    int64_t *out;
    Py_BEGIN_ALLOW_THREADS
    out = find_anchors(d, b.len, bits, &count);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    if (!out) return PyErr_NoMemory();
    PyObject *r = PyBytes_FromStringAndSize((const char *)out, count * (Py_ssize_t)sizeof(int64_t));
    free(out);
    return r;
}

/* pieces(data, bits, least, most, final) -> (ends, keys): from 0, each
 * piece ends at the first anchor at least `least` bytes on if it lies
 * within `most`, else `most` bytes on; the piece reaching past the data's
 * end ends there, kept only where `final`. ends: int64, ascending; keys:
 * the XXH3-64 (seed 0) of each piece's bytes, uint64. */
static PyObject *chunking_pieces(PyObject *self, PyObject *args) {
    Py_buffer b;
    int bits, final;
    Py_ssize_t least, most;
    if (!PyArg_ParseTuple(args, "y*innp", &b, &bits, &least, &most, &final)) return NULL;
    if (bits < 1 || bits > 63 || least < 1 || most < least) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "bits must be 1 to 63 and 1 <= least <= most");
        return NULL;
    }
    const uint8_t *d = b.buf;
    Py_ssize_t stop = b.len, count = 0, cuts = 0;
    int64_t *anchor, *ends = NULL;
    uint64_t *keys = NULL;
    Py_BEGIN_ALLOW_THREADS
    anchor = find_anchors(d, stop, bits, &count);
    /* at most one piece per `least` bytes, and one more for the end */
    Py_ssize_t cap = stop / least + 2;
    if (anchor) {
        ends = malloc(cap * sizeof(int64_t));
        keys = malloc(cap * sizeof(uint64_t));
    }
    if (anchor && ends && keys) {
        Py_ssize_t pos = 0, j = 0;
        for (;;) {
            while (j < count && anchor[j] < pos + least) j++;  /* np.searchsorted(anchor, pos + least): pos only grows */
            if (j < count && anchor[j] <= pos + most) pos = anchor[j];
            else if (pos + most <= stop) pos += most;
            else {
                if (final && pos < stop) ends[cuts++] = stop;
                break;
            }
            ends[cuts++] = pos;
        }
        for (Py_ssize_t i = 0; i < cuts; i++) {
            Py_ssize_t from = i ? ends[i - 1] : 0;
            keys[i] = XXH3_64bits(d + from, (size_t)(ends[i] - from));
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    free(anchor);
    if (!anchor || !ends || !keys) { free(ends); free(keys); return PyErr_NoMemory(); }
    PyObject *r = Py_BuildValue("(y#y#)", (const char *)ends, cuts * (Py_ssize_t)sizeof(int64_t),
                                (const char *)keys, cuts * (Py_ssize_t)sizeof(uint64_t));
    free(ends);
    free(keys);
    return r;
}

static PyMethodDef methods[] = {
    {"anchors", chunking_anchors, METH_VARARGS, "anchors(data, bits) -> int64 offsets (bytes) where pieces may end"},
    {"pieces", chunking_pieces, METH_VARARGS,
     "pieces(data, bits, least, most, final) -> (int64 ends, uint64 XXH3-64 keys) of content-defined pieces"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_chunking", "Content-defined anchors and pieces.", -1, methods};

PyMODINIT_FUNC PyInit__chunking(void) { return PyModule_Create(&module); }
