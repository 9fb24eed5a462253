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
 * The bytes the peer sent stay unread in the socket. Any other process: recv() as is.
 * An MPI rank (Open MPI's: no MLX_RANK, its rank in OMPI_COMM_WORLD_RANK) is wedged
 * the same way at its TCP sockets' readv() as well: Open MPI's TCP transport reads
 * with readv() (strace of a rank in all_sums: readv, writev and poll, no recv), and its
 * progress engine, finding the socket readable again, spins through it for ever. Only
 * AF_INET/AF_INET6 stream sockets (its runtime's own sockets are Unix ones); each fd's
 * kind is asked once, so the user-space spin stays out of the kernel.
 *   MLXWD_WEDGE_MODE=park_eval  recv() as is, but cblas_sgemm() (a matmul on the CPU
 *                             stream's thread) waits for ever on a condition variable
 *                             nobody signals: the mx.eval waiting on it never returns,
 *                             every thread asleep (a quiet hang of one process, as in
 *                             mlx-lm #1834's deadlock in eval). Before the trigger it
 *                             calls the BLAS that libmlx loaded.
 * MLXWD_WEDGE_RANK=* arms every rank, and a process with no MLX_RANK nor
 * OMPI_COMM_WORLD_RANK (world size 1).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static ssize_t (*real_recv)(int, void *, size_t, int);
static ssize_t (*real_readv)(int, const struct iovec *, int);
static int armed = -1;  /* -1: not yet decided, 0: not this rank, 1: this rank */
static int mpi_rank;  /* an Open MPI rank: its readv() on TCP sockets is wedged too */
static volatile int wedged;
static int syscall_mode;
static int park_mode;
static int eval_mode;
static const char *trigger;
static long long next_look_ns;

static void decide(void) {
    const char *want = getenv("MLXWD_WEDGE_RANK");
    const char *rank = getenv("MLX_RANK");
    if (rank == NULL) {
        rank = getenv("OMPI_COMM_WORLD_RANK");
        mpi_rank = rank != NULL;
    }
    const char *mode = getenv("MLXWD_WEDGE_MODE");
    trigger = getenv("MLXWD_WEDGE_FILE");
    syscall_mode = mode != NULL && strcmp(mode, "syscall") == 0;
    park_mode = mode != NULL && strcmp(mode, "park") == 0;
    eval_mode = mode != NULL && strcmp(mode, "park_eval") == 0;
    armed = want != NULL && trigger != NULL
            && (strcmp(want, "*") == 0 || (rank != NULL && strcmp(want, rank) == 0));
}

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Whether this process is armed and its trigger was seen (looked for every 50 ms). */
static int triggered(void) {
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
    return wedged;
}

/* A wedged read: EAGAIN, in user space or after a zero-byte read in the kernel, or
 * asleep for ever (park). */
static ssize_t wedged_read(int fd, int flags) {
    while (park_mode)
        poll(NULL, 0, -1);
    if (syscall_mode) {
        char none;
        if (real_recv == NULL)  /* an MPI rank's readv() may come first */
            real_recv = (ssize_t (*)(int, void *, size_t, int))dlsym(RTLD_NEXT, "recv");
        real_recv(fd, &none, 0, flags | MSG_DONTWAIT);
    }
    errno = EAGAIN;
    return -1;
}

ssize_t recv(int fd, void *buf, size_t len, int flags) {
    if (real_recv == NULL)
        real_recv = (ssize_t (*)(int, void *, size_t, int))dlsym(RTLD_NEXT, "recv");
    if (armed < 0)
        decide();
    if (eval_mode || !triggered())
        return real_recv(fd, buf, len, flags);
    return wedged_read(fd, flags);
}

/* 0: not asked yet, 1: a TCP socket, 2: anything else (fds below FDS_KNOWN). */
#define FDS_KNOWN 4096
static unsigned char fd_kind[FDS_KNOWN];

static int tcp_socket(int fd) {
    if (fd < 0 || fd >= FDS_KNOWN)
        return 0;
    if (fd_kind[fd] == 0) {
        int type = 0;
        socklen_t type_len = sizeof(type);
        struct sockaddr_storage addr;
        socklen_t addr_len = sizeof(addr);
        int tcp = getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_len) == 0
                  && type == SOCK_STREAM
                  && getsockname(fd, (struct sockaddr *)&addr, &addr_len) == 0
                  && (addr.ss_family == AF_INET || addr.ss_family == AF_INET6);
        fd_kind[fd] = tcp ? 1 : 2;
    }
    return fd_kind[fd] == 1;
}

ssize_t readv(int fd, const struct iovec *iov, int iovcnt) {
    if (real_readv == NULL)
        real_readv = (ssize_t (*)(int, const struct iovec *, int))dlsym(RTLD_NEXT, "readv");
    if (armed < 0)
        decide();
    if (!mpi_rank || eval_mode || !triggered() || !tcp_socket(fd))
        return real_readv(fd, iov, iovcnt);
    return wedged_read(fd, 0);
}

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int,
                         const float *, int, float, float *, int);
void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta, float *c,
                 int ldc);
static sgemm_fn real_sgemm;

/* libmlx loads its BLAS privately (RTLD_LOCAL, under Python), out of RTLD_NEXT's
 * reach: the real cblas_sgemm is found in the loaded objects themselves. */
static int find_sgemm(struct dl_phdr_info *info, size_t size, void *unused) {
    (void)size;
    (void)unused;
    if (info->dlpi_name == NULL || info->dlpi_name[0] == '\0')
        return 0;
    void *handle = dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
    if (handle == NULL)
        return 0;
    void *found = dlsym(handle, "cblas_sgemm");
    dlclose(handle);
    if (found == NULL || found == (void *)cblas_sgemm)
        return 0;
    real_sgemm = (sgemm_fn)found;
    return 1;
}

void cblas_sgemm(int order, int trans_a, int trans_b, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta, float *c,
                 int ldc) {
    if (armed < 0)
        decide();
    if (eval_mode && triggered()) {
        static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
        static pthread_cond_t never = PTHREAD_COND_INITIALIZER;
        pthread_mutex_lock(&lock);
        for (;;)
            pthread_cond_wait(&never, &lock);
    }
    if (real_sgemm == NULL)
        dl_iterate_phdr(find_sgemm, NULL);
    if (real_sgemm == NULL)
        abort();  /* no BLAS loaded: nothing to forward to */
    real_sgemm(order, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
