/* The compiled hot path's shared declarations: the structs both of its translation
 * units read, and what one hands the other. Two units, one module
 * (watchdog.rank._fastpath, compiled together by hatch_build.py):
 *
 *   _fastpath.c       the hot path: Path's methods (the per-call code) with every helper
 *                     they call, static and in the same unit, so no call on the hot path
 *                     crosses units; and their method table
 *   _fastpath_type.c  the Path type's setup: the layout by name, construction, GC, the
 *                     type object and the module
 *
 * The sha256 of this file, _fastpath.c and _fastpath_type.c, in that order, goes into
 * the module (compiled.py SOURCES: the hook refuses a module built from other sources).
 */
#ifndef MLXWD_FASTPATH_H
#define MLXWD_FASTPATH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* What one unit hands the other stays inside the module's shared object. */
#if defined(__GNUC__) || defined(__clang__)
#define FASTPATH_SHARED __attribute__((visibility("hidden")))
#else
#define FASTPATH_SHARED
#endif

#define MAX_SLOTS 64

#define MAX_SLOTS 64

typedef struct {
    uint64_t *w;      /* the slot's words: the record, or scratch once retired */
    uint64_t depth;   /* nesting of open waits on this thread */
    uint64_t since;   /* start of the outermost open wait */
    uint64_t completed, collectives, steps, max_wait;
} State;

/* Word indices inside a slot, given by Python (watchdog.record) at construction, each
 * by its name (layout_names in _fastpath_type.c). */
typedef struct {
    Py_ssize_t slot_words, since, op, completed, progress, last_wait, max_wait, steps,
        collectives, ring_at, ring, kind_shift, pace, pace_ops;
    uint64_t init_op;
} Layout;

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int has_view;
    Py_tss_t key;
    int has_key;
    int nslots;                  /* states[nslots] is the overflow slot (scratch) */
    State states[MAX_SLOTS + 1];
    uint64_t *scratch;
    Layout at;
    PyObject *claim;             /* () -> slot index, or -1: no free slot */
    PyObject *fail;              /* (exception) -> None: disables the record */
    PyObject *stretch;           /* [int]: non-zero inside idle() / expect() */
    PyObject *codes;             /* [int] * 256: record dtype code by hash(dtype) & 0xFF */
    PyObject *clock;             /* None: CLOCK_MONOTONIC; else a callable (tests) */
} Path;

static inline uint64_t native_now(void)
{
#ifdef __APPLE__
    /* What time.monotonic_ns reads on macOS: mach_absolute_time in ns. */
    return clock_gettime_nsec_np(CLOCK_UPTIME_RAW);
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
#endif
}

/* From _fastpath.c, for _fastpath_type.c (the one way between the units): the Path's
 * methods; dropping its references (retire() and the GC); the names the hot path looks
 * up, interned (0, or -1 with an exception set); an unsigned 64-bit word from an int or
 * anything with __index__ (0, or -1 with an exception set). */
extern FASTPATH_SHARED PyMethodDef Path_methods[];
FASTPATH_SHARED int Path_clear(Path *p);
FASTPATH_SHARED int fastpath_intern(void);
FASTPATH_SHARED int fastpath_word_arg(PyObject *o, uint64_t *out);

#endif
