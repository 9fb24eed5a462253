/* The compiled hot path's Path type: its setup, not its per-call code (that is
 * _fastpath.c, where the methods are; _fastpath.h has the structs and tells the two
 * units apart). Here: the slot's word indices taken by name, checked to fit the slot;
 * Path(...) itself (the record's buffer, the slot offsets, the Heartbeat's functions);
 * the GC's traverse and dealloc (its clear is _fastpath.c's Path_clear, which retire()
 * shares); the type object and the module with its clock and the sha256 of its sources.
 */
#include "_fastpath.h"

/* Every word of Layout by its name: Python passes a dict of exactly these names
 * (watchdog/rank/compiled.py LAYOUT), so no order is matched by hand, and a name
 * missing or unknown is an error rather than a word written in the wrong place. */
static const struct {
    const char *name;
    size_t at;
    int is_word; /* 1: uint64_t (an op code), 0: Py_ssize_t (an index or a count) */
} layout_names[] = {
    {"slot_words", offsetof(Layout, slot_words), 0},
    {"since", offsetof(Layout, since), 0},
    {"op", offsetof(Layout, op), 0},
    {"completed", offsetof(Layout, completed), 0},
    {"progress", offsetof(Layout, progress), 0},
    {"last_wait", offsetof(Layout, last_wait), 0},
    {"max_wait", offsetof(Layout, max_wait), 0},
    {"steps", offsetof(Layout, steps), 0},
    {"collectives", offsetof(Layout, collectives), 0},
    {"ring_at", offsetof(Layout, ring_at), 0},
    {"ring", offsetof(Layout, ring), 0},
    {"kind_shift", offsetof(Layout, kind_shift), 0},
    {"pace", offsetof(Layout, pace), 0},
    {"pace_ops", offsetof(Layout, pace_ops), 0},
    {"init_op", offsetof(Layout, init_op), 1},
};

static int layout_from(PyObject *names, Layout *at)
{
    const Py_ssize_t nf = (Py_ssize_t)(sizeof layout_names / sizeof layout_names[0]);
    if (!PyDict_Check(names)) {
        PyErr_SetString(PyExc_TypeError, "layout: a dict of word names to ints");
        return -1;
    }
    for (Py_ssize_t i = 0; i < nf; i++) {
        PyObject *value = PyDict_GetItemString(names, layout_names[i].name); /* borrowed */
        if (value == NULL) {
            PyErr_Format(PyExc_ValueError, "layout: no %s", layout_names[i].name);
            return -1;
        }
        char *field = (char *)at + layout_names[i].at;
        if (layout_names[i].is_word) {
            if (fastpath_word_arg(value, (uint64_t *)field))
                return -1;
        } else {
            Py_ssize_t v = PyLong_AsSsize_t(value);
            if (v == -1 && PyErr_Occurred())
                return -1;
            *(Py_ssize_t *)field = v;
        }
    }
    if (PyDict_GET_SIZE(names) != nf) { /* every name above was found: the rest are extra */
        PyObject *key;
        Py_ssize_t pos = 0;
        while (PyDict_Next(names, &pos, &key, NULL)) {
            int known = 0;
            for (Py_ssize_t i = 0; i < nf && !known; i++)
                known = PyUnicode_Check(key) &&
                        PyUnicode_CompareWithASCIIString(key, layout_names[i].name) == 0;
            if (!known) {
                PyErr_Format(PyExc_ValueError, "layout: unknown name %R", key);
                return -1;
            }
        }
    }
    Py_ssize_t words[] = {at->since, at->op, at->completed, at->progress, at->last_wait,
                          at->max_wait, at->steps, at->collectives};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        if (words[i] < 0 || words[i] >= at->ring_at) {
            PyErr_SetString(PyExc_ValueError, "layout: a header word outside the header");
            return -1;
        }
    if (at->ring < 1 || at->ring_at < 1 || at->ring_at + 2 * at->ring > at->slot_words ||
        at->kind_shift < 1 || at->kind_shift > 56) {
        PyErr_SetString(PyExc_ValueError, "layout: the ring does not fit the slot");
        return -1;
    }
    if (at->pace < at->ring_at + 2 * at->ring || at->pace_ops < 1 ||
        at->pace + 2 * at->pace_ops > at->slot_words) {
        PyErr_SetString(PyExc_ValueError, "layout: the pace table does not fit the slot");
        return -1;
    }
    return 0;
}

static int Path_init(Path *p, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"buffer", "offsets", "layout", "claim", "fail", "stretch",
                            "codes", "clock", NULL};
    PyObject *buffer, *offsets, *layout, *claim, *fail, *stretch, *codes, *clock = Py_None;
    if (p->has_key || p->has_view) {
        PyErr_SetString(PyExc_RuntimeError, "a Path is built once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!O!OOO!O!|O", names, &buffer,
                                     &PyTuple_Type, &offsets, &PyDict_Type, &layout, &claim,
                                     &fail, &PyList_Type, &stretch, &PyList_Type, &codes,
                                     &clock))
        return -1;
    if (layout_from(layout, &p->at))
        return -1;
    if (PyList_GET_SIZE(codes) != 256 || PyList_GET_SIZE(stretch) < 1) {
        PyErr_SetString(PyExc_ValueError, "codes: 256 ints; stretch: a list of one int");
        return -1;
    }
    Py_ssize_t nslots = PyTuple_GET_SIZE(offsets);
    if (nslots < 1 || nslots > MAX_SLOTS) {
        PyErr_Format(PyExc_ValueError, "between 1 and %d slots", MAX_SLOTS);
        return -1;
    }
    if (!PyCallable_Check(claim) || !PyCallable_Check(fail) ||
        (clock != Py_None && !PyCallable_Check(clock))) {
        PyErr_SetString(PyExc_TypeError, "claim, fail and clock must be callable");
        return -1;
    }
    p->scratch = PyMem_Calloc((size_t)p->at.slot_words, sizeof(uint64_t));
    if (p->scratch == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (PyObject_GetBuffer(buffer, &p->view, PyBUF_WRITABLE) != 0)
        return -1;
    p->has_view = 1;
    if (((uintptr_t)p->view.buf & 7) != 0) {
        PyErr_SetString(PyExc_ValueError, "the record's words are not aligned");
        return -1;
    }
    Py_ssize_t total = p->view.len / 8;
    for (Py_ssize_t k = 0; k < nslots; k++) {
        Py_ssize_t at = PyLong_AsSsize_t(PyTuple_GET_ITEM(offsets, k));
        if (at == -1 && PyErr_Occurred())
            return -1;
        if (at < 0 || at > total - p->at.slot_words) {
            PyErr_SetString(PyExc_ValueError, "a slot outside the record");
            return -1;
        }
        p->states[k].w = (uint64_t *)p->view.buf + at;
    }
    p->nslots = (int)nslots;
    p->states[nslots].w = p->scratch;
    if (PyThread_tss_create(&p->key) != 0) {
        PyErr_SetString(PyExc_RuntimeError, "no thread-specific key left");
        return -1;
    }
    p->has_key = 1;
    Py_INCREF(claim);
    p->claim = claim;
    Py_INCREF(fail);
    p->fail = fail;
    Py_INCREF(stretch);
    p->stretch = stretch;
    Py_INCREF(codes);
    p->codes = codes;
    if (clock != Py_None) {
        Py_INCREF(clock);
        p->clock = clock;
    }
    return 0;
}

static int Path_traverse(Path *p, visitproc visit, void *arg)
{
    Py_VISIT(p->claim);
    Py_VISIT(p->fail);
    Py_VISIT(p->stretch);
    Py_VISIT(p->codes);
    Py_VISIT(p->clock);
    return 0;
}

static void Path_dealloc(Path *p)
{
    PyObject_GC_UnTrack(p);
    Path_clear(p);
    if (p->has_view)
        PyBuffer_Release(&p->view);
    if (p->has_key)
        PyThread_tss_delete(&p->key);
    PyMem_Free(p->scratch);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static PyTypeObject PathType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "watchdog.rank._fastpath.Path",
    .tp_doc = "One record's hot path: Path(buffer, offsets, layout, claim, fail, "
              "stretch, codes, clock=None); layout: {word name: index}",
    .tp_basicsize = sizeof(Path),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Path_init,
    .tp_dealloc = (destructor)Path_dealloc,
    .tp_traverse = (traverseproc)Path_traverse,
    .tp_clear = (inquiry)Path_clear,
    .tp_methods = Path_methods,
};

/* now() -> the clock the compiled path reads, in ns (checked against time.monotonic_ns). */
static PyObject *module_now(PyObject *m, PyObject *unused)
{
    return PyLong_FromUnsignedLongLong(native_now());
}

static PyMethodDef module_methods[] = {
    {"now", module_now, METH_NOARGS, "now() -> the compiled path's clock, in ns"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastpath", "The hook's hot path, compiled.", -1, module_methods,
};

PyMODINIT_FUNC PyInit__fastpath(void)
{
    if (PyType_Ready(&PathType) < 0)
        return NULL;
    if (fastpath_intern() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
#ifndef SOURCE_SHA256
#define SOURCE_SHA256 ""
#endif
    /* The sha256 of its sources when it was built (hatch_build.py; _fastpath.h, then
     * _fastpath.c, then this file): compiled.py refuses a module built from other ones. */
    if (PyModule_AddStringConstant(m, "SOURCE_SHA256", SOURCE_SHA256) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&PathType);
    if (PyModule_AddObject(m, "Path", (PyObject *)&PathType) < 0) {
        Py_DECREF(&PathType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
