/*
 * uml-xstate.c: an LD_PRELOAD shim that lets a user-mode Linux kernel run on a
 * host whose XSAVE area is larger than the one UML was built for.
 *
 * Why: UML saves and restores each guest thread's FPU state with
 * ptrace(PTRACE_GETREGSET/SETREGSET, NT_X86_XSTATE) on a buffer of a fixed size
 * (struct _xstate, 832 bytes).  A read of a smaller buffer is truncated and
 * works, but the host only accepts a write of the whole XSAVE area (its size
 * is the host's, 2.7 KiB with AVX-512 and 11 KiB with AMX) and fails the short
 * one with EFAULT.  UML then panics at the first context switch ("ptrace set
 * fp regs failed, errno = 14").
 *
 * What: every XSTATE read is done at the host's full size; the part UML asked
 * for goes to UML's buffer, the rest is kept in a shadow copy keyed by that
 * buffer (one per guest thread, since UML keeps one buffer per thread).  A
 * write is rebuilt at the full size from the shadow (the state beyond UML's
 * view, AVX-512 registers for instance) with UML's bytes over its first part.
 * So a guest thread gets back exactly the state it had, also where another
 * thread of the same host process ran in between.
 *
 * Everything else goes to the C library's ptrace unchanged; on a host whose
 * area is no larger than UML's buffer the shim changes nothing.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/types.h>
#include <sys/uio.h>

#ifndef NT_X86_XSTATE
#define NT_X86_XSTATE 0x202
#endif

/* A large enough first read learns the host's size (the kernel shortens
 * iov_len to what it wrote). */
#define PROBE_BYTES (64 * 1024)
/* Guest threads alive at once that the shadow can follow; beyond that a
 * write falls back to the target's current state for the part UML does not
 * see, which is what the host would have done had it accepted a short write. */
#define SLOTS 8192

typedef long (*ptrace_fn)(enum __ptrace_request, ...);

static ptrace_fn real_ptrace;
static size_t host_size;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

struct slot {
    void *key;
    unsigned char *full;
};
static struct slot slots[SLOTS];

static ptrace_fn next_ptrace(void)
{
    if (!real_ptrace)
        real_ptrace = (ptrace_fn)dlsym(RTLD_NEXT, "ptrace");
    return real_ptrace;
}

/* The host's XSAVE size for this tracee, learned once. 0 if unknown. */
static size_t learn_host_size(pid_t pid)
{
    if (host_size)
        return host_size;
    void *probe = malloc(PROBE_BYTES);
    if (!probe)
        return 0;
    struct iovec iov = { probe, PROBE_BYTES };
    if (next_ptrace()(PTRACE_GETREGSET, pid, (void *)NT_X86_XSTATE, &iov) == 0)
        host_size = iov.iov_len;
    free(probe);
    return host_size;
}

static struct slot *find_slot(void *key, int create)
{
    size_t h = ((uintptr_t)key >> 4) % SLOTS;
    for (size_t i = 0; i < SLOTS; i++) {
        struct slot *s = &slots[(h + i) % SLOTS];
        if (s->key == key)
            return s;
        if (s->key == NULL) {
            if (!create)
                return NULL;
            s->full = malloc(host_size);
            if (!s->full)
                return NULL;
            s->key = key;
            return s;
        }
    }
    return NULL;
}

static long get_xstate(pid_t pid, struct iovec *iov)
{
    size_t asked = iov->iov_len;
    pthread_mutex_lock(&lock);
    struct slot *s = find_slot(iov->iov_base, 1);
    long r = -1;
    int err = ENOMEM;
    if (s) {
        struct iovec full = { s->full, host_size };
        r = next_ptrace()(PTRACE_GETREGSET, pid, (void *)NT_X86_XSTATE, &full);
        err = errno;
        if (r == 0) {
            size_t n = asked < full.iov_len ? asked : full.iov_len;
            memcpy(iov->iov_base, s->full, n);
            iov->iov_len = n;
        }
    }
    pthread_mutex_unlock(&lock);
    errno = err;
    return r;
}

static long set_xstate(pid_t pid, struct iovec *iov)
{
    pthread_mutex_lock(&lock);
    struct slot *s = find_slot(iov->iov_base, 0);
    unsigned char *full = s ? s->full : malloc(host_size);
    long r = -1;
    int err = ENOMEM;
    if (full) {
        int ready = s != NULL;
        if (!ready) {
            struct iovec cur = { full, host_size };
            ready = next_ptrace()(PTRACE_GETREGSET, pid, (void *)NT_X86_XSTATE, &cur) == 0;
            err = errno;
        }
        if (ready) {
            memcpy(full, iov->iov_base, iov->iov_len);
            struct iovec out = { full, host_size };
            r = next_ptrace()(PTRACE_SETREGSET, pid, (void *)NT_X86_XSTATE, &out);
            err = errno;
        }
        if (!s)
            free(full);
    }
    pthread_mutex_unlock(&lock);
    errno = err;
    return r;
}

long ptrace(enum __ptrace_request request, ...)
{
    va_list ap;
    va_start(ap, request);
    pid_t pid = va_arg(ap, pid_t);
    void *addr = va_arg(ap, void *);
    void *data = va_arg(ap, void *);
    va_end(ap);

    int xstate = (request == PTRACE_GETREGSET || request == PTRACE_SETREGSET) &&
                 (uintptr_t)addr == NT_X86_XSTATE && data != NULL;
    if (xstate) {
        struct iovec *iov = data;
        size_t size = learn_host_size(pid);
        if (size > iov->iov_len) {
            if (request == PTRACE_GETREGSET)
                return get_xstate(pid, iov);
            return set_xstate(pid, iov);
        }
    }
    return next_ptrace()(request, pid, addr, data);
}
