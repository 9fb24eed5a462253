/* A wedge injector for the tests (LD_PRELOAD): one rank's ring worker made to spin on
 * a socket that never delivers, as mlx PR 4060's stale-EAGAIN spin does.
 *
 * Built by the test at run time (cc -shared -fPIC -o wedge.so wedge_shim.c -ldl). In the
 * process whose MLX_RANK equals MLXWD_WEDGE_RANK, once the file MLXWD_WEDGE_FILE exists
 * (looked for at most every 50 ms, by the vDSO clock), every recv() answers EAGAIN:
 *   MLXWD_WEDGE_MODE=user     without entering the kernel (a user-space spin);
 *   MLXWD_WEDGE_MODE=syscall  after a real non-blocking zero-byte recv() (a spin
 *                             through the kernel);
 *   MLXWD_WEDGE_MODE=park     never: the calling thread sleeps in poll() for ever,
 *                             nothing spinning (a quiet hang).
 * MLXWD_WEDGE_RANK=* arms every rank.
 * The bytes the peer sent stay unread in the socket. Any other process: recv() as is.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

static ssize_t (*real_recv)(int, void *, size_t, int);
static int armed = -1;  /* -1: not yet decided, 0: not this rank, 1: this rank */
static volatile int wedged;
static int syscall_mode;
static int park_mode;
static const char *trigger;
static long long next_look_ns;

static void decide(void) {
    const char *want = getenv("MLXWD_WEDGE_RANK");
    const char *rank = getenv("MLX_RANK");
    const char *mode = getenv("MLXWD_WEDGE_MODE");
    trigger = getenv("MLXWD_WEDGE_FILE");
    syscall_mode = mode != NULL && strcmp(mode, "syscall") == 0;
    park_mode = mode != NULL && strcmp(mode, "park") == 0;
    armed = want != NULL && rank != NULL && trigger != NULL
            && (strcmp(want, "*") == 0 || strcmp(want, rank) == 0);
}

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

ssize_t recv(int fd, void *buf, size_t len, int flags) {
    if (real_recv == NULL)
        real_recv = (ssize_t (*)(int, void *, size_t, int))dlsym(RTLD_NEXT, "recv");
    if (armed < 0)
        decide();
    if (armed && !wedged) {
        long long now = now_ns();
        if (now >= next_look_ns) {
            next_look_ns = now + 50000000LL;
            if (access(trigger, F_OK) == 0)
                wedged = 1;
        }
    }
    if (!wedged)
        return real_recv(fd, buf, len, flags);
    while (park_mode)
        poll(NULL, 0, -1);
    if (syscall_mode) {
        char none;
        real_recv(fd, &none, 0, flags | MSG_DONTWAIT);
    }
    errno = EAGAIN;
    return -1;
}
