/* Layout kernels: a tiled transpose for the `transpose` operator (brevis/dsl/delta.py).
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

#define TILE 32

#define TRANSPOSE(T) { \
    const T *s = src; T *d = dst; \
    for (Py_ssize_t i0 = 0; i0 < rows; i0 += TILE) { \
        Py_ssize_t i1 = i0 + TILE < rows ? i0 + TILE : rows; \
        for (Py_ssize_t j0 = 0; j0 < cols; j0 += TILE) { \
            Py_ssize_t j1 = j0 + TILE < cols ? j0 + TILE : cols; \
            for (Py_ssize_t i = i0; i < i1; i++) \
                for (Py_ssize_t j = j0; j < j1; j++) d[j * rows + i] = s[i * cols + j]; \
        } \
    } \
}

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
    if (itemsize == 1) TRANSPOSE(uint8_t)
    else if (itemsize == 2) TRANSPOSE(uint16_t)
    else if (itemsize == 4) TRANSPOSE(uint32_t)
    else TRANSPOSE(uint64_t)
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&sb);
    PyBuffer_Release(&db);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"transpose", layout_transpose, METH_VARARGS, "transpose(src, rows, cols, itemsize, dst) -> None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_layout", "Layout kernels: a tiled transpose.", -1, methods};

PyMODINIT_FUNC PyInit__layout(void) { return PyModule_Create(&module); }
