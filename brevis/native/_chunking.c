/* Content-defined anchors for the repeat search (brevis/formats/repeats.py).
 *
 * anchors(data, bits) -> bytes: the offsets i + 8 (int64, ascending) of the
 * 8-byte windows data[i:i+8] whose hash, h = (w ^ w >> 29) * K with w the
 * little-endian word, has its top `bits` bits clear. The same function as
 * repeats.anchors in numpy, which made eight passes over the data for each
 * of the eight window phases (80 MB/s here); one pass here.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define K 0x9E3779B97F4A7C15ULL

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
    Py_ssize_t n = b.len - 7, cap = 1024, count = 0;
    int64_t *out = malloc(cap * sizeof(int64_t));
    int nomem = out == NULL;
    int shift = 64 - bits;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n && !nomem; i++) {
        uint64_t w;
        memcpy(&w, d + i, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        w = __builtin_bswap64(w);  /* the word is read little-endian, as numpy's "<u8" */
#endif
        uint64_t h = (w ^ (w >> 29)) * K;
        if ((h >> shift) == 0) {
            if (count == cap) {
                int64_t *grown = realloc(out, 2 * cap * sizeof(int64_t));
                if (!grown) { nomem = 1; break; }
                out = grown;
                cap *= 2;
            }
            out[count++] = i + 8;
        }
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    if (nomem) { free(out); return PyErr_NoMemory(); }
    PyObject *r = PyBytes_FromStringAndSize((const char *)out, count * (Py_ssize_t)sizeof(int64_t));
    free(out);
    return r;
}

static PyMethodDef methods[] = {
    {"anchors", chunking_anchors, METH_VARARGS, "anchors(data, bits) -> int64 offsets (bytes) where pieces may end"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_chunking", "Content-defined anchors.", -1, methods};

PyMODINIT_FUNC PyInit__chunking(void) { return PyModule_Create(&module); }
