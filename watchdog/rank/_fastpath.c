/* The hook's hot path, compiled: the same stores as watchdog/rank/hotpath.py's
 * `real()`, in the same order, into the same words of a record v3 thread slot.
 *
 * Optional: built at install time when a C compiler is there, and used only if
 * its clock agrees with time.monotonic_ns (watchdog/rank/compiled.py decides and
 * `mlx-watchdog doctor` reports the choice). The pure-Python path stays the
 * reference; tests/unit/rank/test_compiled.py checks both write the same bytes.
 *
 * Rules, as in hotpath.py: each thread owns one slot (found through a
 * thread-specific key) and is its only writer, so nothing takes a lock; every
 * call that may run Python (the slot claim, a test clock, an attribute of the
 * array) comes before the stores, and after it the Path is checked to be still
 * live and the slot's word pointer is read again, so a record retired meanwhile
 * is never written (a retired Path, or one never built, records nothing); the
 * store that commits comes after the data it commits, with release order so
 * that a weakly ordered CPU (Apple silicon) publishes them in that order too.
 * Errors go to the Heartbeat's `fail` (which disables the record), never to the
 * user's program; an interrupt (KeyboardInterrupt, SystemExit) raised by the
 * Python the hot path calls (the claim, `fail`, a test clock) passes through,
 * as it does in the Python path.
 *
 * This unit is the per-call code only, with every helper it calls, so that none of
 * those calls crosses units; the Path type's setup (construction, GC, the module) is
 * _fastpath_type.c, and _fastpath.h holds the structs both read.
 */
#include "_fastpath.h"

static PyObject *str_nbytes, *str_dtype;

static inline void put(uint64_t *w, Py_ssize_t i, uint64_t v)
{
    __atomic_store_n(&w[i], v, __ATOMIC_RELEASE);
}

/* Initialized and not retired: only then are claim, fail, stretch, codes and the key
 * there. Every call that may run Python can retire the Path, so this is checked again
 * after such a call before any of them is used. */
static inline int live(const Path *p)
{
    return p->claim != NULL;
}

/* An unsigned 64-bit word from an int, or anything with __index__ (as a store into a
 * memoryview takes it). */
static int word_arg(PyObject *o, uint64_t *out)
{
    if (PyLong_Check(o)) {
        *out = PyLong_AsUnsignedLongLong(o);
    } else {
        PyObject *i = PyNumber_Index(o);
        if (i == NULL)
            return -1;
        *out = PyLong_AsUnsignedLongLong(i);
        Py_DECREF(i);
    }
    return (*out == (uint64_t)-1 && PyErr_Occurred()) ? -1 : 0;
}

/* A wrong number of arguments is the caller's error, raised as Python would raise it. */
static int bad_args(Py_ssize_t n, Py_ssize_t want, const char *name)
{
    if (n == want)
        return 0;
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", name, want, n);
    return -1;
}

static int now_ns(Path *p, uint64_t *out)
{
    if (p->clock == NULL) {
        *out = native_now();
        return 0;
    }
    PyObject *clock = Py_NewRef(p->clock);  /* a retire() inside the call drops it */
    PyObject *r = PyObject_CallNoArgs(clock);
    Py_DECREF(clock);
    if (r == NULL)
        return -1;
    int bad = word_arg(r, out);
    Py_DECREF(r);
    return bad;
}

/* The pending error goes to `fail`, unless it is an interrupt, which passes on. */
static int report(Path *p)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (type == NULL)
        return 0;
    if (!PyErr_GivenExceptionMatches(type, PyExc_Exception)) {
        PyErr_Restore(type, value, tb);
        return -1;
    }
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL)
        PyException_SetTraceback(value, tb);
    PyObject *r = NULL;
    if (p->fail != NULL) {  /* NULL: retired already, nothing left to disable */
        PyObject *fail = Py_NewRef(p->fail);  /* fail() retires, which drops p->fail */
        r = PyObject_CallOneArg(fail, value ? value : Py_None);
        Py_DECREF(fail);
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    if (r == NULL && PyErr_Occurred()) {
        /* An interrupt raised by a signal handler inside fail() is the user's. */
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return -1;
        PyErr_Clear();  /* any other error of fail() never reaches the user's program */
    }
    Py_XDECREF(r);
    return 0;
}

static State *slot_of(Path *p)
{
    State *st = (State *)PyThread_tss_get(&p->key);
    if (st != NULL)
        return st;
    PyObject *claim = Py_NewRef(p->claim);
    PyObject *r = PyObject_CallNoArgs(claim);
    Py_DECREF(claim);
    if (r == NULL)
        return NULL;
    long k = PyLong_AsLong(r);
    Py_DECREF(r);
    if (k == -1 && PyErr_Occurred())
        return NULL;
    if (!live(p))
        return NULL;  /* retired inside the claim (its key is gone): nothing to record */
    st = (k >= 0 && k < p->nslots) ? &p->states[k] : &p->states[p->nslots];
    if (PyThread_tss_set(&p->key, st) != 0) {
        PyErr_SetString(PyExc_RuntimeError, "cannot keep the thread's slot");
        return NULL;
    }
    return st;
}


/* Open a wait on this thread's slot. 0: open since *now, on *out; 1: not recorded
 * (the error went to `fail`, or the Path is retired); -1: an interrupt to pass on. */
static int open_wait(Path *p, PyObject *op_arg, uint64_t *now, State **out)
{
    uint64_t op;
    State *st;
    if (!live(p))
        return 1;
    if (word_arg(op_arg, &op) || (st = slot_of(p)) == NULL || now_ns(p, now))
        return report(p) ? -1 : 1;
    if (!st->depth) {
        st->since = *now;
        put(st->w, p->at.op, op);
        put(st->w, p->at.since, *now);  /* commits: this thread is in a wait since now */
    }
    st->depth++;
    *out = st;
    return 0;
}

/* Close the wait opened on `st` at `started` (before anything that could let a signal
 * handler run), then count it and time it. 0, or -1: an interrupt to pass on. */
static int close_wait(Path *p, State *st, uint64_t started, PyObject *op_arg)
{
    uint64_t op, now;
    uint64_t d = st->depth > 1 ? st->depth - 1 : 0;
    if (!d)
        put(st->w, p->at.since, 0);  /* commits: out of the wait (scratch if retired) */
    st->depth = d;
    if (!live(p))
        return 0;  /* retired while the call ran: nothing more to record */
    if (word_arg(op_arg, &op) || now_ns(p, &now))
        return report(p);
    if (!live(p))
        return 0;  /* a test clock's Python retired it */
    uint64_t *w = st->w;
    put(w, p->at.progress, now);
    st->completed++;
    put(w, p->at.completed, st->completed);
    if (op == p->at.init_op || d)
        return 0;
    if (now < started) {
        PyErr_SetString(PyExc_OverflowError, "a wait ended before it started");
        return report(p);
    }
    uint64_t last = now - started;
    put(w, p->at.last_wait, last);
    /* Waits inside idle() or expect() are not the rank's normal pace: they are neither
     * counted in the pace table nor stretch the learned deadline. */
    if (PyList_GET_SIZE(p->stretch) < 1) {  /* never read past a list someone emptied */
        PyErr_SetString(PyExc_IndexError, "the stretch list is empty");
        return report(p);
    }
    int stretched = PyObject_IsTrue(PyList_GET_ITEM(p->stretch, 0));
    if (stretched < 0)
        return report(p);
    if (stretched)
        return 0;
    if (op >= (uint64_t)p->at.pace_ops) {  /* as the Python path's index would */
        PyErr_SetString(PyExc_IndexError, "an op code outside the pace table");
        return report(p);
    }
    w = st->w;  /* again: IsTrue may have run Python (and retired the Path) */
    Py_ssize_t i = p->at.pace + 2 * (Py_ssize_t)op;  /* the op's entry: count, longest */
    put(w, i, w[i] + 1);
    if (last > w[i + 1]) {
        put(w, i + 1, last);
        if (last > st->max_wait) {
            st->max_wait = last;
            put(w, p->at.max_wait, last);
        }
    }
    return 0;
}

/* enter_wait(op) -> start time: a blocking call starts (0 if it could not be recorded). */
static PyObject *enter_wait(Path *p, PyObject *const *args, Py_ssize_t n)
{
    uint64_t now = 0;
    State *st = NULL;
    if (bad_args(n, 1, "enter_wait"))
        return NULL;
    int done = open_wait(p, args[0], &now, &st);
    if (done < 0)
        return NULL;
    return PyLong_FromUnsignedLongLong(done ? 0 : now);
}

/* exit_wait(started, op): the blocking call that enter_wait started returned or raised. */
static PyObject *exit_wait(Path *p, PyObject *const *args, Py_ssize_t n)
{
    uint64_t started;
    if (bad_args(n, 2, "exit_wait"))
        return NULL;
    int truth = PyObject_IsTrue(args[0]);
    if (truth == 0 || (truth > 0 && !live(p)))
        Py_RETURN_NONE;
    if (truth < 0 || word_arg(args[0], &started))
        return report(p) ? NULL : Py_NewRef(Py_None);
    State *st = (State *)PyThread_tss_get(&p->key);
    if (st == NULL) {
        PyErr_SetString(PyExc_AttributeError,
                        "this thread has no slot: exit_wait without enter_wait");
        return report(p) ? NULL : Py_NewRef(Py_None);
    }
    if (close_wait(p, st, started, args[1]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* wait(original, op, args, kwargs) -> original(*args, **kwargs), inside a wait. The
 * whole bracket in one C call: no signal handler can run between the call's end and
 * the wait's close, nor between the open and the call. The original's result or
 * exception passes through unchanged. */
static PyObject *wait(Path *p, PyObject *const *args, Py_ssize_t n)
{
    if (n != 4 || !PyTuple_Check(args[2]) || !PyDict_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "wait(original, op, args: tuple, kwargs: dict)");
        return NULL;
    }
    uint64_t now = 0;
    State *st = NULL;
    int opened = open_wait(p, args[1], &now, &st);
    if (opened < 0)
        return NULL;
    PyObject *res = PyObject_Call(args[0], args[2], PyDict_GET_SIZE(args[3]) ? args[3] : NULL);
    if (opened == 0) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (close_wait(p, st, now, args[1]) < 0) {  /* an interrupt from a test clock */
            Py_XDECREF(res);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
            return NULL;
        }
        PyErr_Restore(type, value, tb);
    }
    return res;
}

/* collective(op, out): a collective was issued; count it and add it to the flight ring. */
static PyObject *collective(Path *p, PyObject *const *args, Py_ssize_t n)
{
    uint64_t op, nbytes, now;
    State *st;
    if (bad_args(n, 2, "collective"))
        return NULL;
    if (!live(p))
        Py_RETURN_NONE;
    PyObject *o = PyObject_GetAttr(args[1], str_nbytes);
    if (o == NULL)
        goto error;
    int bad = word_arg(o, &nbytes);
    Py_DECREF(o);
    if (bad)
        goto error;
    o = PyObject_GetAttr(args[1], str_dtype);
    if (o == NULL)
        goto error;
    Py_hash_t h = PyObject_Hash(o);
    Py_DECREF(o);
    if (h == -1 && PyErr_Occurred())
        goto error;
    if (!live(p))
        Py_RETURN_NONE;  /* the attributes ran Python that retired it */
    if (PyList_GET_SIZE(p->codes) != 256) {  /* never read past a list someone shrank */
        PyErr_SetString(PyExc_IndexError, "the dtype code table is not 256 long");
        goto error;
    }
    long code = PyLong_AsLong(PyList_GET_ITEM(p->codes, (Py_ssize_t)((uint64_t)h & 0xFF)));
    if ((code == -1 && PyErr_Occurred()) || word_arg(args[0], &op))
        goto error;
    if (code < 0 || (nbytes >> (64 - p->at.kind_shift)) != 0) {
        PyErr_SetString(PyExc_OverflowError, "collective too large for its entry");
        goto error;
    }
    uint64_t kind = nbytes << p->at.kind_shift | (uint64_t)code << 8 | op;
    if ((st = slot_of(p)) == NULL || now_ns(p, &now))
        goto error;
    uint64_t c = st->collectives + 1;
    Py_ssize_t i = p->at.ring_at + (Py_ssize_t)(c % (uint64_t)p->at.ring) * 2;
    uint64_t *w = st->w;
    put(w, i, now);
    put(w, i + 1, kind);
    st->collectives = c;
    put(w, p->at.collectives, c);  /* commits the entry */
    Py_RETURN_NONE;
error:
    if (report(p))
        return NULL;
    Py_RETURN_NONE;
}

/* step(): one unit of user progress. */
static PyObject *step(Path *p, PyObject *const *args, Py_ssize_t n)
{
    State *st;
    if (bad_args(n, 0, "step"))
        return NULL;
    if (!live(p))
        Py_RETURN_NONE;
    if ((st = slot_of(p)) == NULL) {
        if (report(p))
            return NULL;
        Py_RETURN_NONE;
    }
    st->steps++;
    put(st->w, p->at.steps, st->steps);
    Py_RETURN_NONE;
}

/* release(k): slot k's thread ended (called on that thread). Never leave a wait open
 * behind it, and forget the slot: a thread Python saw end may come back into Python
 * as the same OS thread (a callback from a foreign thread), and must then claim a
 * slot anew rather than write one that another thread may have taken. */
static PyObject *release(Path *p, PyObject *arg)
{
    long k = PyLong_AsLong(arg);
    if (k == -1 && PyErr_Occurred())
        return NULL;
    if (k < 0 || k >= p->nslots) {
        PyErr_SetString(PyExc_IndexError, "no such slot");
        return NULL;
    }
    State *st = &p->states[k];
    if (st->depth) {
        st->depth = 0;
        put(st->w, p->at.since, 0);
    }
    if (p->has_key && PyThread_tss_get(&p->key) == st &&
        PyThread_tss_set(&p->key, NULL) != 0) {
        PyErr_SetString(PyExc_RuntimeError, "cannot forget the thread's slot");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* Drop the Path's references: on retire(), and as the type's tp_clear for the GC. */
int Path_clear(Path *p)
{
    Py_CLEAR(p->claim);
    Py_CLEAR(p->fail);
    Py_CLEAR(p->stretch);
    Py_CLEAR(p->codes);
    Py_CLEAR(p->clock);
    return 0;
}

/* retire(): every later call records nothing and every store goes to scratch memory;
 * the record's buffer is let go (so that its map can close), and so are the Heartbeat's
 * functions (which hold the Heartbeat, which holds this) and the thread key. */
static PyObject *retire(Path *p, PyObject *unused)
{
    for (int k = 0; k <= p->nslots; k++)
        p->states[k].w = p->scratch;
    if (p->has_view) {
        p->has_view = 0;
        PyBuffer_Release(&p->view);
    }
    if (p->has_key) {
        p->has_key = 0;
        PyThread_tss_delete(&p->key);
    }
    Path_clear(p);
    Py_RETURN_NONE;
}

/* totals() -> (collectives, waits completed, threads in a wait, steps) over the slots. */
static PyObject *totals(Path *p, PyObject *unused)
{
    uint64_t c = 0, done = 0, open = 0, steps = 0;
    for (int k = 0; k < p->nslots; k++) {
        c += p->states[k].collectives;
        done += p->states[k].completed;
        open += p->states[k].depth != 0;
        steps += p->states[k].steps;
    }
    return Py_BuildValue("(KKKK)", (unsigned long long)c, (unsigned long long)done,
                         (unsigned long long)open, (unsigned long long)steps);
}

/* The Path's methods, for its type object (_fastpath_type.c). */
PyMethodDef Path_methods[] = {
    {"enter_wait", (PyCFunction)(void (*)(void))enter_wait, METH_FASTCALL,
     "enter_wait(op) -> start: a blocking call starts"},
    {"exit_wait", (PyCFunction)(void (*)(void))exit_wait, METH_FASTCALL,
     "exit_wait(started, op): the blocking call returned or raised"},
    {"wait", (PyCFunction)(void (*)(void))wait, METH_FASTCALL,
     "wait(original, op, args, kwargs): original(*args, **kwargs) inside a wait"},
    {"collective", (PyCFunction)(void (*)(void))collective, METH_FASTCALL,
     "collective(op, out): a collective was issued"},
    {"step", (PyCFunction)(void (*)(void))step, METH_FASTCALL,
     "step(): one unit of user progress"},
    {"release", (PyCFunction)release, METH_O, "release(k): slot k's thread ended"},
    {"retire", (PyCFunction)retire, METH_NOARGS, "retire(): later stores go nowhere"},
    {"totals", (PyCFunction)totals, METH_NOARGS,
     "totals() -> (collectives, waits completed, threads in a wait, steps)"},
    {NULL, NULL, 0, NULL},
};

/* Called once, by the module's init. */
int fastpath_intern(void)
{
    str_nbytes = PyUnicode_InternFromString("nbytes");
    str_dtype = PyUnicode_InternFromString("dtype");
    return (str_nbytes == NULL || str_dtype == NULL) ? -1 : 0;
}

/* word_arg for the type's setup (the layout's op code), off the hot path: the hot path's
 * own calls stay calls of the static function, within this unit. */
int fastpath_word_arg(PyObject *o, uint64_t *out)
{
    return word_arg(o, out);
}
