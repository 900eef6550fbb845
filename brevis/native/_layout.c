/* Layout kernels: a tiled transpose for the `transpose` operator
 * (brevis/dsl/delta.py), the classify and scatter that undo `partition`
 * (brevis/dsl/symbols.py), the column copy that undoes `records` and the
 * join of bit ranges that undoes fields (brevis/dsl/fields.py).
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

#define SCATTER(T) { \
    T *d = dst; \
    for (Py_ssize_t i = 0; i < n; i++) { uint8_t c = cls[i]; d[i] = ((const T *)src[c])[used[c]++]; } \
}

/* scatter(classes, parts, itemsize, dst) -> None
 * dst[i] = the next element of parts[classes[i]]: the inverse of taking each
 * class's elements in order (partition). classes: n bytes, each below
 * len(parts) <= 256; parts: buffers of itemsize-byte elements (1, 2, 4 or
 * 8), part j holding exactly as many as classes holds j's; dst: n elements.
 * numpy's one pass per class (compare, flatnonzero, fancy index) cost
 * about 7 ns an element; this is one pass. */
static PyObject *layout_scatter(PyObject *self, PyObject *args) {
    PyObject *co, *po, *dobj;
    int itemsize;
    if (!PyArg_ParseTuple(args, "OOiO", &co, &po, &itemsize, &dobj)) return NULL;
    if (itemsize != 1 && itemsize != 2 && itemsize != 4 && itemsize != 8) {
        PyErr_SetString(PyExc_ValueError, "itemsize must be 1, 2, 4 or 8");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(po, "parts must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
    if (k < 1 || k > 256) { Py_DECREF(seq); PyErr_SetString(PyExc_ValueError, "1 to 256 parts"); return NULL; }
    Py_buffer cb, db, pb[256];
    Py_ssize_t held = 0, have[256], used[256] = {0};
    const void *src[256];
    int ok = 0;
    if (PyObject_GetBuffer(co, &cb, PyBUF_C_CONTIGUOUS) < 0) { Py_DECREF(seq); return NULL; }
    if (PyObject_GetBuffer(dobj, &db, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) goto release_classes;
    for (; held < k; held++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, held), &pb[held], PyBUF_C_CONTIGUOUS) < 0) goto release;
        src[held] = pb[held].buf;
        have[held] = pb[held].len / itemsize;
    }
    const uint8_t *cls = cb.buf;
    Py_ssize_t n = cb.len, counts[256] = {0};
    void *dst = db.buf;
    if (db.len != n * itemsize) { PyErr_SetString(PyExc_ValueError, "dst must hold one element per class"); goto release; }
    for (Py_ssize_t i = 0; i < n; i++) counts[cls[i]]++;
    for (int c = 0; c < 256; c++)
        if (counts[c] != (c < k ? have[c] : 0) || (c < k && pb[c].len != have[c] * itemsize)) {
            PyErr_SetString(PyExc_ValueError, "the parts do not hold the classes' elements");
            goto release;
        }
    Py_BEGIN_ALLOW_THREADS
    if (itemsize == 1) SCATTER(uint8_t)
    else if (itemsize == 2) SCATTER(uint16_t)
    else if (itemsize == 4) SCATTER(uint32_t)
    else SCATTER(uint64_t)
    Py_END_ALLOW_THREADS
    ok = 1;
release:
    for (Py_ssize_t j = 0; j < held; j++) PyBuffer_Release(&pb[j]);
    PyBuffer_Release(&db);
release_classes:
    PyBuffer_Release(&cb);
    Py_DECREF(seq);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

#define PLACE(W) for (Py_ssize_t r = 0; r < records; r++) memcpy(d + r * stride, s + r * (W), (W));

/* place(src, width, records, stride, offset, dst) -> None
 * Record r of dst (stride bytes each) gets src's r-th width bytes at byte
 * `offset`: the inverse of taking one field of fixed-size records
 * (`records`). numpy's strided copy of a two-byte column of 18-byte
 * records cost about 3 ns a record; fixed-size copies here, about 0.5. */
static PyObject *layout_place(PyObject *self, PyObject *args) {
    PyObject *so, *dobj;
    Py_ssize_t width, records, stride, offset;
    if (!PyArg_ParseTuple(args, "OnnnnO", &so, &width, &records, &stride, &offset, &dobj)) return NULL;
    if (width < 1 || records < 0 || offset < 0 || stride < width || offset > stride - width
        || (records && stride > PY_SSIZE_T_MAX / records)) {
        PyErr_SetString(PyExc_ValueError, "a field of width bytes at offset must lie inside records of stride bytes");
        return NULL;
    }
    Py_buffer sb, db;
    if (PyObject_GetBuffer(so, &sb, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(dobj, &db, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) { PyBuffer_Release(&sb); return NULL; }
    if (sb.len != width * records || db.len != stride * records) {
        PyBuffer_Release(&sb); PyBuffer_Release(&db);
        PyErr_SetString(PyExc_ValueError, "src must hold width * records bytes and dst stride * records");
        return NULL;
    }
    const uint8_t *s = sb.buf;
    uint8_t *d = (uint8_t *)db.buf + offset;
    Py_BEGIN_ALLOW_THREADS
    switch (width) {  /* fixed sizes: the copies compile to a load and a store */
    case 1: PLACE(1) break;
    case 2: PLACE(2) break;
    case 4: PLACE(4) break;
    case 8: PLACE(8) break;
    case 16: PLACE(16) break;
    case 32: PLACE(32) break;
    default: PLACE(width) break;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&sb);
    PyBuffer_Release(&db);
    Py_RETURN_NONE;
}

/* One range over all elements: dst (|)= ((src >> pos) & mask) << low, in
 * the destination's width; one loop per pair of widths so that each
 * compiles to straight shifts (the compiler vectorizes them). */
#define PUT_RANGE(S, D) { \
    const S *v = (const S *)src; D *d = (D *)dst; \
    if (first) for (Py_ssize_t i = 0; i < n; i++) d[i] = (D)((((uint64_t)v[i] >> pos) & mask) << low); \
    else for (Py_ssize_t i = 0; i < n; i++) d[i] |= (D)((((uint64_t)v[i] >> pos) & mask) << low); \
}
#define PUT_RANGE_TO(S) { \
    if (dsize == 1) PUT_RANGE(S, uint8_t) else if (dsize == 2) PUT_RANGE(S, uint16_t) \
    else if (dsize == 4) PUT_RANGE(S, uint32_t) else PUT_RANGE(S, uint64_t) \
}

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
    PyObject *seq = PySequence_Fast(ro, "ranges must be a sequence of (low, width)");
    int ok = 0;
    Py_ssize_t ssize = sb.itemsize, dsize = db.itemsize;
    if (!seq) goto done;
    if ((ssize != 1 && ssize != 2 && ssize != 4 && ssize != 8) || (dsize != 1 && dsize != 2 && dsize != 4 && dsize != 8)
        || sb.len / ssize != db.len / dsize) {
        PyErr_SetString(PyExc_ValueError, "src and dst must hold as many items of 1, 2, 4 or 8 bytes");
        goto done;
    }
    Py_ssize_t n = db.len / dsize, count = PySequence_Fast_GET_SIZE(seq);
    long lows[64], widths[64];
    if (count > 64) { PyErr_SetString(PyExc_ValueError, "at most 64 ranges"); goto done; }
    long total = 0;
    for (Py_ssize_t r = 0; r < count; r++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(seq, r);
        if (!PyArg_ParseTuple(pair, "ll", &lows[r], &widths[r])) goto done;
        if (lows[r] < 0 || widths[r] < 1 || lows[r] + widths[r] > 8 * dsize) {
            PyErr_SetString(PyExc_ValueError, "a range must lie inside dst's words");
            goto done;
        }
        total += widths[r];
    }
    if (total > 8 * ssize) { PyErr_SetString(PyExc_ValueError, "the ranges are wider than src's items"); goto done; }
    const void *src = sb.buf;
    void *dst = db.buf;
    Py_BEGIN_ALLOW_THREADS
    long pos = 0;
    for (Py_ssize_t r = count - 1; r >= 0; r--) {  /* the last range holds the field's lowest bits */
        const long low = lows[r];
        const uint64_t mask = widths[r] >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << widths[r]) - 1);
        if (ssize == 1) PUT_RANGE_TO(uint8_t)
        else if (ssize == 2) PUT_RANGE_TO(uint16_t)
        else if (ssize == 4) PUT_RANGE_TO(uint32_t)
        else PUT_RANGE_TO(uint64_t)
        first = 0;
        pos += widths[r];
    }
    Py_END_ALLOW_THREADS
    ok = 1;
done:
    Py_XDECREF(seq);
    PyBuffer_Release(&sb);
    PyBuffer_Release(&db);
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

#define CLASSIFY(T) { \
    const T *v = src; \
    for (Py_ssize_t i = 0; i < n; i++) { \
        if ((uint64_t)v[i] >= (uint64_t)tlen) { bad = 1; break; } \
        uint8_t c = table[v[i]]; cls[i] = c; counts[c]++; \
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
    Py_ssize_t size = sb.itemsize, n = cb.len, tlen = tb.len, counts[256] = {0};
    int bad = 0;
    const char *error = NULL;
    if ((size != 1 && size != 2 && size != 4 && size != 8) || sb.len != n * size)
        error = "context and classes must hold as many items (of 1, 2, 4 or 8 bytes; classes of 1)";
    else {
        const void *src = sb.buf;
        const uint8_t *table = tb.buf;
        uint8_t *cls = cb.buf;
        Py_BEGIN_ALLOW_THREADS
        if (size == 1) CLASSIFY(uint8_t)
        else if (size == 2) CLASSIFY(uint16_t)
        else if (size == 4) CLASSIFY(uint32_t)
        else CLASSIFY(uint64_t)
        Py_END_ALLOW_THREADS
        if (bad) error = "a context value lies past the class table";
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

static PyMethodDef methods[] = {
    {"transpose", layout_transpose, METH_VARARGS, "transpose(src, rows, cols, itemsize, dst) -> None"},
    {"scatter", layout_scatter, METH_VARARGS, "scatter(classes, parts, itemsize, dst) -> None"},
    {"place", layout_place, METH_VARARGS, "place(src, width, records, stride, offset, dst) -> None"},
    {"join", layout_join, METH_VARARGS, "join(src, ranges, dst, first) -> None"},
    {"classify", layout_classify, METH_VARARGS, "classify(context, table, classes) -> counts of the 256 classes"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_layout", "Layout kernels: a tiled transpose, the inverse of a partition.", -1, methods};

PyMODINIT_FUNC PyInit__layout(void) { return PyModule_Create(&module); }
