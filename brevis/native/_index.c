/* The archive index's hot loops in C: each file's segments (their chunks,
 * streams, gathered ranges and members) and where they lie in the file.
 *
 * brevis/archive/schema.py declares the index and compiles its reader to
 * Python; that reader stays the one authority. These functions read the
 * common shape of an index only, check what it checks, build the same
 * objects, and give up (None) on anything else: any value it would refuse,
 * and anything rare (a segment coded against a base tensor, integers
 * beyond 64 bits, a digest spelled other than 32 hex digits). The Python
 * reader then reads the whole index itself, and names what is wrong. So
 * this can be stricter than the schema, never laxer; the tests hold the two
 * to the same objects on real and damaged indexes.
 *
 * Measured (AMD EPYC, one-shot unpack in fresh processes): the segments
 * of an index took 40-80 % of reading it, and reading it 12-40 % of
 * unpacking a checkpoint of 0.5 to 21 MB. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

/* What setup() was given: the schema's helpers and the records' classes. */
static PyObject *programs_fn, *dtypes_by_name, *tensor_fn, *bytes_type, *segment_cls, *chunk_cls;
static long long max_chunk_bytes, max_decode_bytes;
static Py_ssize_t max_dims;
static PyObject *k_name, *k_dtype, *k_shape, *k_length, *k_programs, *k_chunks, *k_search, *k_base, *k_ranges,
    *k_members, *k_itemsize;

#define MAX_DIMS_HERE 64  /* the most dimensions a shape may have here (format.MAX_DIMS is not more) */

/* t, where it is a tuple of ints, strings and tuples made by untracked()
 * only, left out of the cyclic collector's lists: no cycle passes through
 * it. CPython untracks such a tuple itself, but only once a collection has
 * visited it; the first one after an index is read visited each of its
 * stream locations, ranges and shapes: most of the objects it scans (fracast's
 * index: 381 of 532, pocketnet's 1,701 of 2,761). */
static PyObject *untracked(PyObject *t) {
    if (t) PyObject_GC_UnTrack(t);
    return t;
}

/* An exact int (not a bool) that fits 64 bits: 1 and *out, else 0. */
static int int64_of(PyObject *o, long long *out) {
    if (!PyLong_CheckExact(o)) return 0;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) { PyErr_Clear(); return 0; }
    *out = v;
    return 1;
}

/* A shape, [d, ...]: at most max_dims exact ints >= 0 (Shape's check), as a
 * tuple; its product of max(d, 1) times itemsize below 2^63 (shape_fits)
 * in *fits, its product in *product (where it fits 63 bits, else -1).
 * NULL where malformed (no exception set). */
static PyObject *shape_of(PyObject *v, long long itemsize, int *fits, long long *product) {
    if (!PyList_CheckExact(v) || PyList_GET_SIZE(v) > max_dims) return NULL;  /* setup: max_dims <= MAX_DIMS_HERE */
    Py_ssize_t n = PyList_GET_SIZE(v);
    unsigned __int128 nonzero = (unsigned __int128)itemsize, all = 1;
    int big = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        long long d;
        if (!int64_of(PyList_GET_ITEM(v, i), &d) || d < 0) return NULL;
        nonzero *= (unsigned __int128)(d ? d : 1);
        all *= (unsigned __int128)d;
        if (nonzero >> 63) big = 1;  /* stays past 2^63: the product only grows (factors >= 1) */
        if (big) nonzero = (unsigned __int128)1 << 63;
        if (all >> 63) all = (unsigned __int128)1 << 63;  /* saturated: no 64-bit length equals it */
    }
    *fits = !big;
    *product = all >> 63 ? -1 : (long long)all;
    return untracked(PyList_AsTuple(v));  /* ints */
}

/* ranges_of: [[offset >= 0, length >= 1], ...] as a tuple of int pairs;
 * their lengths' sum in *total (checked against overflow). NULL where
 * malformed or past 64 bits. */
static PyObject *ranges_of(PyObject *v, long long *total) {
    if (!PyList_CheckExact(v)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(v);
    PyObject *out = PyTuple_New(n);
    if (!out) { PyErr_Clear(); return NULL; }
    long long sum = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(v, i);
        long long off, len;
        if (!PyList_CheckExact(r) || PyList_GET_SIZE(r) != 2 || !int64_of(PyList_GET_ITEM(r, 0), &off)
            || !int64_of(PyList_GET_ITEM(r, 1), &len) || off < 0 || len < 1 || __builtin_add_overflow(sum, len, &sum)) {
            Py_DECREF(out);
            return NULL;
        }
        PyObject *pair = untracked(PyList_AsTuple(r));  /* two ints */
        if (!pair) { PyErr_Clear(); Py_DECREF(out); return NULL; }
        PyTuple_SET_ITEM(out, i, pair);
    }
    *total = sum;
    return untracked(out);
}

/* members_of, and its check against the ranges: [[name, shape], ...], as
 * many as the ranges, each shape's product times itemsize its range's
 * length; a tuple of (name, shape tuple). NULL where not so. */
static PyObject *members_of(PyObject *v, PyObject *ranges, long long itemsize) {
    if (!PyList_CheckExact(v) || PyList_GET_SIZE(v) != PyTuple_GET_SIZE(ranges)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(v);
    PyObject *out = PyTuple_New(n);
    if (!out) { PyErr_Clear(); return NULL; }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *m = PyList_GET_ITEM(v, i);
        int fits;
        long long product, want;
        if (!PyList_CheckExact(m) || PyList_GET_SIZE(m) != 2 || !PyUnicode_CheckExact(PyList_GET_ITEM(m, 0))) goto bad;
        PyObject *shape = shape_of(PyList_GET_ITEM(m, 1), 1, &fits, &product);
        if (!shape) goto bad;
        want = PyLong_AsLongLong(PyTuple_GET_ITEM(PyTuple_GET_ITEM(ranges, i), 1));
        if (product < 0 || (__int128)product * itemsize != want) {
            Py_DECREF(shape);
            goto bad;
        }
        PyObject *pair = untracked(PyTuple_Pack(2, PyList_GET_ITEM(m, 0), shape));  /* a string, a shape */
        Py_DECREF(shape);
        if (!pair) { PyErr_Clear(); goto bad; }
        PyTuple_SET_ITEM(out, i, pair);
    }
    return untracked(out);
bad:
    Py_DECREF(out);
    return NULL;
}

/* 32 hex digits as 16 bytes; NULL where not exactly that. */
static PyObject *digest_of(PyObject *v) {
    if (!PyUnicode_CheckExact(v) || PyUnicode_GET_LENGTH(v) != 32 || PyUnicode_KIND(v) != PyUnicode_1BYTE_KIND)
        return NULL;
    const Py_UCS1 *s = PyUnicode_1BYTE_DATA(v);
    unsigned char raw[16];
    for (int i = 0; i < 32; i++) {
        int c = s[i], x = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                          : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (x < 0) return NULL;
        if (i & 1) raw[i >> 1] |= (unsigned char)x; else raw[i >> 1] = (unsigned char)(x << 4);
    }
    PyObject *out = PyBytes_FromStringAndSize((const char *)raw, 16);
    if (!out) PyErr_Clear();
    return out;
}

/* Where a call into Python failed: an Exception gives up (the Python
 * reader reads the index again and says what is wrong); anything else
 * (KeyboardInterrupt, SystemExit) goes on up. */
static int give_up_on_error(void) {
    if (PyErr_ExceptionMatches(PyExc_Exception)) { PyErr_Clear(); return 1; }
    return 0;
}

/* A chunk, [program, n, [[offset, length, check], ...], digest]: checked
 * as the schema's CHUNK and STREAM records check it. NULL where refused. */
static PyObject *chunk_of(PyObject *v, Py_ssize_t count, long long max_n, PyObject *streams_of, PyObject *peaks,
                          long long start, long long end, long long *n_out) {
    long long program, n;
    if (!PyList_CheckExact(v) || PyList_GET_SIZE(v) != 4) return NULL;
    PyObject *po = PyList_GET_ITEM(v, 0), *no = PyList_GET_ITEM(v, 1), *so = PyList_GET_ITEM(v, 2);
    if (!int64_of(po, &program) || program < 0 || program >= count) return NULL;
    if (!int64_of(no, &n) || n <= 0 || n > max_n) return NULL;
    long long want;
    if (!PyList_CheckExact(so) || !int64_of(PyList_GET_ITEM(streams_of, program), &want)
        || PyList_GET_SIZE(so) != want)
        return NULL;
    double peak = PyFloat_AsDouble(PyList_GET_ITEM(peaks, program));
    if (peak == -1.0 && PyErr_Occurred()) { PyErr_Clear(); return NULL; }
    /* the schema's `peak * n <= MAX_DECODE_BYTES`, in doubles as Python's float times int */
    if (!(peak * (double)n <= (double)max_decode_bytes)) return NULL;
    Py_ssize_t k = PyList_GET_SIZE(so);
    PyObject *streams = PyList_New(k);
    if (!streams) { PyErr_Clear(); return NULL; }
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *s = PyList_GET_ITEM(so, i);
        long long off, len, crc;
        if (!PyList_CheckExact(s) || PyList_GET_SIZE(s) != 3 || !int64_of(PyList_GET_ITEM(s, 0), &off)
            || !int64_of(PyList_GET_ITEM(s, 1), &len) || !int64_of(PyList_GET_ITEM(s, 2), &crc)
            || !(start <= off && len >= 0 && (__int128)off + len <= end) || crc < 0 || crc >= 4294967296LL) {
            Py_DECREF(streams);
            return NULL;
        }
        PyObject *t = untracked(PyList_AsTuple(s));  /* three ints */
        if (!t) { PyErr_Clear(); Py_DECREF(streams); return NULL; }
        PyList_SET_ITEM(streams, i, t);
    }
    PyObject *digest = digest_of(PyList_GET_ITEM(v, 3));
    if (!digest) { Py_DECREF(streams); return NULL; }
    PyObject *args[4] = {po, no, streams, digest};
    PyObject *chunk = PyObject_Vectorcall(chunk_cls, args, 4, NULL);
    Py_DECREF(streams);
    Py_DECREF(digest);
    *n_out = n;
    return chunk;
}

/* schema.programs' answer where its cache holds it already: a list of
 * numbers of the program table, each in it, that an earlier segment of
 * the same value type named (the key programs() files it under). A new
 * reference, or NULL (an exception only where one was raised): then
 * programs() itself is asked. */
static PyObject *cached_programs(PyObject *values, PyObject *t, PyObject *cache, PyObject *table) {
    if (table == Py_None || !PyList_CheckExact(table) || !PyDict_CheckExact(cache)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(values), entries = PyList_GET_SIZE(table);
    for (Py_ssize_t i = 0; i < n; i++) {
        long long k;
        if (!int64_of(PyList_GET_ITEM(values, i), &k) || k < 0 || k >= entries) return NULL;
    }
    PyObject *numbers = PyList_AsTuple(values), *id = PyLong_FromVoidPtr(t), *key = NULL, *hit = NULL, *out = NULL;
    if (numbers && id && (key = PyTuple_Pack(2, numbers, id)))
        hit = PyDict_GetItemWithError(cache, key);  /* borrowed */
    if (hit && PyTuple_CheckExact(hit) && PyTuple_GET_SIZE(hit) == 4 && PyList_CheckExact(PyTuple_GET_ITEM(hit, 0))) {
        PyObject *own = PyList_GetSlice(PyTuple_GET_ITEM(hit, 0), 0, PY_SSIZE_T_MAX);  /* a list of its own */
        if (own)
            out = PyTuple_Pack(4, own, PyTuple_GET_ITEM(hit, 1), PyTuple_GET_ITEM(hit, 2), PyTuple_GET_ITEM(hit, 3));
        Py_XDECREF(own);
    }
    Py_XDECREF(numbers);
    Py_XDECREF(id);
    Py_XDECREF(key);
    return out;
}

/* Whether every key of a segment's object is one this reader reads: a
 * key it does not know (a field the schema gained, or one it ignores) is
 * left to the schema's loops. */
static int known_keys(PyObject *s) {
    PyObject *const known[10] = {k_name, k_dtype, k_shape, k_length, k_programs, k_chunks, k_search, k_base,
                                 k_ranges, k_members};
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(s, &pos, &key, &value)) {
        int found = 0;
        for (int i = 0; i < 10 && !found; i++)
            found = key == known[i] || (PyUnicode_CheckExact(key) && PyUnicode_Compare(key, known[i]) == 0);
        if (!found) return 0;
    }
    return 1;
}

/* One segment (the schema's SEGMENT record) as a SegmentEntry; NULL where
 * refused (no exception), or NULL with an exception that must go up. */
static PyObject *segment_of(PyObject *s, long long start, long long end, PyObject *cache, PyObject *table) {
    PyObject *shape = NULL, *programs = NULL, *chunks = NULL, *ranges = NULL, *members = NULL, *out = NULL;
    if (!PyDict_CheckExact(s) || !known_keys(s)) return NULL;
    PyObject *name = PyDict_GetItemWithError(s, k_name);
    if (!name || !PyUnicode_CheckExact(name)) goto done;
    PyObject *dtype_name = PyDict_GetItemWithError(s, k_dtype), *dtype = Py_None;
    long long itemsize = 1;
    if (dtype_name && dtype_name != Py_None) {
        if (!PyUnicode_CheckExact(dtype_name) || !(dtype = PyDict_GetItemWithError(dtypes_by_name, dtype_name)))
            goto done;
        PyObject *size = PyObject_GetAttr(dtype, k_itemsize);
        if (!size) goto done;
        int ok = int64_of(size, &itemsize) && itemsize >= 1;
        Py_DECREF(size);
        if (!ok) goto done;
    }
    PyObject *shape_json = PyDict_GetItemWithError(s, k_shape);
    int fits = 1;
    long long product = 0;
    if (shape_json && shape_json != Py_None && !(shape = shape_of(shape_json, itemsize, &fits, &product))) goto done;
    PyObject *length_o = PyDict_GetItemWithError(s, k_length);
    long long length;
    if (!length_o || !int64_of(length_o, &length) || length < 0) goto done;
    if ((dtype == Py_None) != (shape == NULL)) goto done;  /* bytes have no shape; a tensor has one */
    if (dtype != Py_None && (!fits || product < 0 || (__int128)product * itemsize != length)) goto done;
    long long max_n = max_chunk_bytes / itemsize;
    PyObject *programs_json = PyDict_GetItemWithError(s, k_programs);
    if (!programs_json || !PyList_CheckExact(programs_json)) goto done;
    PyObject *t = dtype == Py_None ? (Py_INCREF(bytes_type), bytes_type) : PyObject_CallOneArg(tensor_fn, dtype);
    if (!t) goto done;
    PyObject *got = cached_programs(programs_json, t, cache, table);
    if (!got && !PyErr_Occurred()) {
        PyObject *call[5] = {programs_json, t, cache, Py_None, table};
        got = PyObject_Vectorcall(programs_fn, call, 5, NULL);
    }
    Py_DECREF(t);
    if (!got) goto done;
    if (!PyTuple_CheckExact(got) || PyTuple_GET_SIZE(got) != 4) { Py_DECREF(got); goto done; }
    programs = PyTuple_GET_ITEM(got, 0);
    Py_INCREF(programs);
    PyObject *streams_of = PyTuple_GET_ITEM(got, 1), *peaks = PyTuple_GET_ITEM(got, 2);
    int reference = PyObject_IsTrue(PyTuple_GET_ITEM(got, 3));
    if (reference) { Py_DECREF(got); goto done; }  /* coded against a base (or refused): the Python reader's */
    if (!PyList_CheckExact(programs) || !PyList_CheckExact(streams_of) || !PyList_CheckExact(peaks)
        || PyList_GET_SIZE(streams_of) != PyList_GET_SIZE(programs) || PyList_GET_SIZE(peaks) != PyList_GET_SIZE(programs)) {
        Py_DECREF(got);
        goto done;
    }
    Py_ssize_t count = PyList_GET_SIZE(programs);
    PyObject *chunks_json = PyDict_GetItemWithError(s, k_chunks);
    if (!chunks_json || !PyList_CheckExact(chunks_json) || !(chunks = PyList_New(PyList_GET_SIZE(chunks_json)))) {
        Py_DECREF(got);
        goto done;
    }
    long long total = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(chunks_json); i++) {
        long long n = 0;
        PyObject *c = chunk_of(PyList_GET_ITEM(chunks_json, i), count, max_n, streams_of, peaks, start, end, &n);
        if (!c) { Py_DECREF(got); goto done; }
        PyList_SET_ITEM(chunks, i, c);
        total += n;  /* each n <= max_n: no overflow short of 2^37 chunks */
    }
    Py_DECREF(got);
    if ((__int128)total * itemsize != length) goto done;
    PyObject *search = PyDict_GetItemWithError(s, k_search);
    if (search && !PyDict_CheckExact(search)) goto done;
    PyObject *base = PyDict_GetItemWithError(s, k_base);
    if (base && base != Py_None) goto done;  /* rare: the Python reader's */
    PyObject *ranges_json = PyDict_GetItemWithError(s, k_ranges), *members_json = PyDict_GetItemWithError(s, k_members);
    if (ranges_json && ranges_json != Py_None) {
        long long sum;
        if (!(ranges = ranges_of(ranges_json, &sum)) || PyTuple_GET_SIZE(ranges) == 0 || sum != length) goto done;
    }
    int has_members = members_json && members_json != Py_None;
    if (has_members != (ranges != NULL && dtype != Py_None)) goto done;
    if (has_members && !(members = members_of(members_json, ranges, itemsize))) goto done;
    PyObject *search_value = search ? (Py_INCREF(search), search) : PyDict_New();
    if (!search_value) goto done;
    PyObject *args[10] = {name, dtype, shape ? shape : Py_None, length_o, programs, chunks, search_value, Py_None,
                          ranges ? ranges : Py_None, members ? members : Py_None};
    out = PyObject_Vectorcall(segment_cls, args, 10, NULL);
    Py_DECREF(search_value);
done:  /* out is NULL on every way here but the last: refused, or a call's exception set */
    Py_XDECREF(shape);
    Py_XDECREF(programs);
    Py_XDECREF(chunks);
    Py_XDECREF(ranges);
    Py_XDECREF(members);
    return out;
}

/* segments(list, start, end, cache, table) -> list of SegmentEntry, or None
 * The schema's `List(SEGMENT)` of one file, read as its compiled reader
 * reads it; None where it gives up (see the top of this file). */
static PyObject *index_segments(PyObject *self, PyObject *args) {
    PyObject *v, *cache, *table;
    long long start, end;
    if (!PyArg_ParseTuple(args, "OLLOO", &v, &start, &end, &cache, &table)) return NULL;
    if (!segment_cls) { PyErr_SetString(PyExc_RuntimeError, "_index.setup() was not called"); return NULL; }
    if (!PyList_CheckExact(v)) Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(v);
    PyObject *out = PyList_New(n);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(v, i);
        Py_INCREF(item);  /* held while Python code (programs) runs */
        PyObject *seg = segment_of(item, start, end, cache, table);
        Py_DECREF(item);
        if (!seg) {
            Py_DECREF(out);
            if (PyErr_Occurred() && !give_up_on_error()) return NULL;
            Py_RETURN_NONE;
        }
        PyList_SET_ITEM(out, i, seg);
    }
    return out;
}

typedef struct { long long off, len; } range_t;

static int by_range(const void *a, const void *b) {
    const range_t *x = a, *y = b;
    if (x->off != y->off) return x->off < y->off ? -1 : 1;
    return x->len < y->len ? -1 : x->len > y->len;
}

/* placements(segments, size) -> list of tuples of (offset, length), or None
 * schema.placements: where each segment's bytes lie in its file (a
 * gathered segment at its ranges, the others in order filling the rest);
 * None where that refuses them (its message is the Python one's). */
static PyObject *index_placements(PyObject *self, PyObject *args) {
    PyObject *segments, *size_o;
    long long size;
    if (!PyArg_ParseTuple(args, "OO", &segments, &size_o)) return NULL;
    if (!PyList_CheckExact(segments) || !int64_of(size_o, &size)) Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(segments), total = 0;
    PyObject **ranges = PyMem_Calloc(n ? n : 1, sizeof(PyObject *));
    long long *lengths = PyMem_Calloc(n ? n : 1, sizeof(long long));
    range_t *taken = NULL;
    PyObject *out = NULL;
    int refuse = 0;
    if (!ranges || !lengths) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *seg = PyList_GET_ITEM(segments, i);
        PyObject *r = PyObject_GetAttr(seg, k_ranges);
        if (!r) goto done;
        ranges[i] = r;
        PyObject *len = PyObject_GetAttr(seg, k_length);
        if (!len) goto done;
        int ok = int64_of(len, &lengths[i]);
        Py_DECREF(len);
        if (!ok) { refuse = 1; goto done; }
        if (r == Py_None) continue;
        if (!PyTuple_CheckExact(r)) { refuse = 1; goto done; }
        total += PyTuple_GET_SIZE(r);
    }
    taken = PyMem_Malloc((total ? total : 1) * sizeof(range_t));
    if (!taken) { PyErr_NoMemory(); goto done; }
    Py_ssize_t t = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (ranges[i] == Py_None) continue;
        long long prev_end = 0;
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(ranges[i]); j++) {
            PyObject *p = PyTuple_GET_ITEM(ranges[i], j);
            range_t r;
            if (!PyTuple_CheckExact(p) || PyTuple_GET_SIZE(p) != 2 || !int64_of(PyTuple_GET_ITEM(p, 0), &r.off)
                || !int64_of(PyTuple_GET_ITEM(p, 1), &r.len) || r.off < 0 || r.len < 0
                || (j && prev_end > r.off)) { refuse = 1; goto done; }  /* a segment's own ranges in file order */
            if (__builtin_add_overflow(r.off, r.len, &prev_end)) { refuse = 1; goto done; }
            taken[t++] = r;
        }
    }
    qsort(taken, (size_t)t, sizeof(range_t), by_range);
    long long at = 0;
    for (Py_ssize_t k = 0; k < t; k++) {
        if (taken[k].off < at) { refuse = 1; goto done; }  /* ranges overlap */
        at = taken[k].off + taken[k].len;
    }
    if (at > size) { refuse = 1; goto done; }
    out = PyList_New(n);
    if (!out) goto done;
    long long pos = 0;
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (ranges[i] != Py_None && PyTuple_GET_SIZE(ranges[i])) {
            Py_INCREF(ranges[i]);
            PyList_SET_ITEM(out, i, ranges[i]);
            continue;
        }
        while (k < t && taken[k].off == pos) pos += taken[k++].len;
        if (lengths[i] && k < t && (__int128)taken[k].off < (__int128)pos + lengths[i]) {
            refuse = 1;  /* lies across a gathered range */
            goto done;
        }
        PyObject *piece = Py_BuildValue("((LL))", pos, lengths[i]);
        if (!piece) { Py_CLEAR(out); goto done; }
        PyList_SET_ITEM(out, i, piece);
        if (__builtin_add_overflow(pos, lengths[i], &pos)) { refuse = 1; goto done; }
    }
done:
    if (ranges)
        for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(ranges[i]);
    PyMem_Free(ranges);
    PyMem_Free(lengths);
    PyMem_Free(taken);
    if (refuse) { Py_XDECREF(out); Py_RETURN_NONE; }
    return out;
}

/* setup(programs, dtypes, tensor, BYTES, SegmentEntry, Chunk, MAX_CHUNK_BYTES, MAX_DECODE_BYTES, MAX_DIMS) -> None
 * What the readers use: schema.programs, dtypes.DTYPES (name -> DType),
 * types.tensor, types.BYTES, the records' classes and the limits. */
static PyObject *index_setup(PyObject *self, PyObject *args) {
    PyObject *p, *d, *t, *b, *s, *c;
    long long mc, md, dims;
    if (!PyArg_ParseTuple(args, "OO!OOOOLLL", &p, &PyDict_Type, &d, &t, &b, &s, &c, &mc, &md, &dims)) return NULL;
    if (dims < 0 || dims > MAX_DIMS_HERE || mc < 1 || md < 0) {
        PyErr_SetString(PyExc_ValueError, "limits out of range");
        return NULL;
    }
    PyObject **slots[6] = {&programs_fn, &dtypes_by_name, &tensor_fn, &bytes_type, &segment_cls, &chunk_cls};
    PyObject *given[6] = {p, d, t, b, s, c};
    for (int i = 0; i < 6; i++) {
        Py_INCREF(given[i]);
        Py_XSETREF(*slots[i], given[i]);
    }
    max_chunk_bytes = mc;
    max_decode_bytes = md;
    max_dims = (Py_ssize_t)dims;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"setup", index_setup, METH_VARARGS, "setup(programs, dtypes, tensor, BYTES, SegmentEntry, Chunk, MAX_CHUNK_BYTES, "
                                         "MAX_DECODE_BYTES, MAX_DIMS) -> None"},
    {"segments", index_segments, METH_VARARGS, "segments(list, start, end, cache, table) -> list | None"},
    {"placements", index_placements, METH_VARARGS, "placements(segments, size) -> list | None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_index", "The archive index's hot loops.", -1, methods};

PyMODINIT_FUNC PyInit__index(void) {
    PyObject **keys[11] = {&k_name, &k_dtype, &k_shape, &k_length, &k_programs, &k_chunks, &k_search, &k_base,
                           &k_ranges, &k_members, &k_itemsize};
    const char *names[11] = {"name", "dtype", "shape", "length", "programs", "chunks", "search", "base",
                             "ranges", "members", "itemsize"};
    for (int i = 0; i < 11; i++)
        if (!*keys[i] && !(*keys[i] = PyUnicode_InternFromString(names[i]))) return NULL;
    return PyModule_Create(&module);
}
