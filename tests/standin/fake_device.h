/* Test-only fake accelerator shared by the CUDA and Ascend stand-in driver libraries.
 *
 * "Device memory" is an address range the host cannot touch: a PROT_NONE mapping of a memfd.
 * The stand-in's own copy functions reach the same pages through a second, read-write
 * mapping, so any plain memcpy on a device pointer outside the driver crashes the test
 * (SIGSEGV) while driver copies work. Host registrations are recorded so pointer queries
 * can report pinned host memory.
 *
 * Fake streams (left out with -DSTANDIN_NO_STREAMS): each stream is a thread running a FIFO
 * of ops (copy, wait until a 32-bit word equals a value, host function, event record). The
 * device address of registered host memory is the host address itself.
 *
 * Never shipped: built by tests/device_standin.rs. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static pthread_mutex_t fake_lock = PTHREAD_MUTEX_INITIALIZER;
static char *fake_base;   /* PROT_NONE view: the device addresses handed out */
static char *fake_shadow; /* read-write view used by the copy functions */
static size_t fake_size, fake_used;

#define FAKE_MAX_REGS 256
static struct { uintptr_t base; size_t len; } fake_regs[FAKE_MAX_REGS];

/* Counters the tests read with dlsym. */
unsigned long fake_device_copies, fake_device_copy_bytes, fake_host_registered, fake_host_unregistered;

static int fake_setup(void) {
    pthread_mutex_lock(&fake_lock);
    int ok = 1;
    if (!fake_base) {
        const char *env = getenv("FAKE_DEVICE_BYTES");
        fake_size = env ? strtoull(env, NULL, 10) : (size_t)256 << 20;
        int fd = memfd_create("fake-device", 0);
        ok = fd >= 0 && ftruncate(fd, (off_t)fake_size) == 0;
        if (ok) {
            fake_base = mmap(NULL, fake_size, PROT_NONE, MAP_SHARED, fd, 0);
            fake_shadow = mmap(NULL, fake_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            ok = fake_base != MAP_FAILED && fake_shadow != MAP_FAILED;
            if (!ok) fake_base = NULL;
        }
        if (fd >= 0) close(fd);
    }
    pthread_mutex_unlock(&fake_lock);
    return ok;
}

static int fake_is_device(uintptr_t p) {
    return fake_base && p >= (uintptr_t)fake_base && p < (uintptr_t)fake_base + fake_size;
}

/* Whether [p, p+len) lies inside one host registration. */
static int fake_is_registered_range(uintptr_t p, size_t len) {
    int found = 0;
    pthread_mutex_lock(&fake_lock);
    for (int i = 0; i < FAKE_MAX_REGS; i++)
        if (fake_regs[i].len && p >= fake_regs[i].base && p + len <= fake_regs[i].base + fake_regs[i].len)
            found = 1;
    pthread_mutex_unlock(&fake_lock);
    return found;
}

static int fake_is_registered(uintptr_t p) { return fake_is_registered_range(p, 1); }

/* The host-accessible view of an address: device addresses go through the shadow. */
static void *fake_view(uintptr_t p) {
    return fake_is_device(p) ? (void *)(fake_shadow + (p - (uintptr_t)fake_base)) : (void *)p;
}

static int fake_alloc(size_t len, uintptr_t *out) {
    if (!fake_setup()) return 0;
    pthread_mutex_lock(&fake_lock);
    size_t at = (fake_used + 255) & ~(size_t)255;
    int ok = at + len <= fake_size;
    if (ok) {
        fake_used = at + len;
        *out = (uintptr_t)fake_base + at;
    }
    pthread_mutex_unlock(&fake_lock);
    return ok;
}

/* Test hook, written by the tests through dlsym: every copy with a side overlapping
 * [fake_refuse_base, fake_refuse_base + fake_refuse_len) is refused — synchronous copies fail,
 * asynchronous ones are refused at enqueue — as a driver refuses a bad address. Counted in
 * fake_refused_copies. */
unsigned long fake_refuse_base, fake_refuse_len, fake_refused_copies;

static int fake_overlaps_refused(uintptr_t p, size_t len) {
    uintptr_t base = __atomic_load_n(&fake_refuse_base, __ATOMIC_ACQUIRE);
    size_t n = __atomic_load_n(&fake_refuse_len, __ATOMIC_ACQUIRE);
    return n && len && p < base + n && base < p + len;
}

/* 1 (and counted) when the hook refuses a copy of `len` bytes from `src` to `dst`. */
__attribute__((unused)) static int fake_copy_refused(uintptr_t dst, uintptr_t src, size_t len) {
    int refused = fake_overlaps_refused(dst, len) || fake_overlaps_refused(src, len);
    if (refused) __atomic_add_fetch(&fake_refused_copies, 1, __ATOMIC_RELAXED);
    return refused;
}

static void fake_copy(uintptr_t dst, uintptr_t src, size_t len) {
    memcpy(fake_view(dst), fake_view(src), len);
    __atomic_add_fetch(&fake_device_copies, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&fake_device_copy_bytes, len, __ATOMIC_RELAXED);
}

/* 0 ok, 1 refused by FAKE_FAIL_HOST_REGISTER, 2 already registered / no room. */
__attribute__((unused)) static int fake_register(uintptr_t p, size_t len) {
    if (getenv("FAKE_FAIL_HOST_REGISTER")) return 1;
    int rc = 2;
    pthread_mutex_lock(&fake_lock);
    int overlap = 0;
    for (int i = 0; i < FAKE_MAX_REGS; i++)
        if (fake_regs[i].len && p < fake_regs[i].base + fake_regs[i].len && fake_regs[i].base < p + len)
            overlap = 1;
    for (int i = 0; i < FAKE_MAX_REGS && !overlap && rc; i++)
        if (!fake_regs[i].len) {
            fake_regs[i].base = p;
            fake_regs[i].len = len;
            fake_host_registered++;
            rc = 0;
        }
    pthread_mutex_unlock(&fake_lock);
    return rc;
}

__attribute__((unused)) static int fake_unregister(uintptr_t p) {
    int rc = 1;
    pthread_mutex_lock(&fake_lock);
    for (int i = 0; i < FAKE_MAX_REGS; i++)
        if (fake_regs[i].len && fake_regs[i].base == p) {
            fake_regs[i].len = 0;
            fake_host_unregistered++;
            rc = 0;
        }
    pthread_mutex_unlock(&fake_lock);
    return rc;
}

#ifndef STANDIN_NO_STREAMS
#include <time.h>

/* Counters the tests read with dlsym: async copies enqueued, async copies with a host side
 * that is neither registered nor device memory (the library must never make one: it could
 * block the caller on a gated stream), host functions and waits enqueued. */
unsigned long fake_async_copies, fake_pageable_async_sources, fake_host_fns, fake_waits;

/* How long a stream's wait or a synchronize may take before the stand-in gives up (the
 * library opens every gate long before; this only keeps a broken test from hanging). */
#define FAKE_LIMIT_S 120

enum fake_op_kind { FAKE_OP_COPY, FAKE_OP_WAIT, FAKE_OP_HOST_FN, FAKE_OP_RECORD };

struct fake_event {
    unsigned long recorded, completed; /* record stamps: issued / reached by the stream */
};

struct fake_op {
    enum fake_op_kind kind;
    uintptr_t dst, src; /* COPY; WAIT waits on the word at dst */
    size_t len;
    uint32_t value;
    void (*fn)(void *);
    void *arg;
    struct fake_event *event;
    unsigned long stamp;
    struct fake_op *next;
};

struct fake_stream {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    struct fake_op *head, *tail;
    unsigned long enqueued, finished;
    int closing, capturing;
};

#define FAKE_MAX_STREAMS 64
static struct fake_stream *fake_streams[FAKE_MAX_STREAMS];
static struct fake_stream *fake_default_stream;
static pthread_once_t fake_default_once = PTHREAD_ONCE_INIT;
/* Guards event stamps; signalled when a record op completes. */
static pthread_cond_t fake_event_changed = PTHREAD_COND_INITIALIZER;

static struct timespec fake_deadline(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += FAKE_LIMIT_S;
    return t;
}

static void fake_run_op(struct fake_op *op) {
    switch (op->kind) {
    case FAKE_OP_COPY:
        fake_copy(op->dst, op->src, op->len);
        break;
    case FAKE_OP_WAIT: {
        const uint32_t *word = fake_view(op->dst);
        struct timespec nap = {0, 20000};
        for (long i = 0; __atomic_load_n(word, __ATOMIC_ACQUIRE) != op->value; i++) {
            if (i > (long)FAKE_LIMIT_S * 50000) {
                fprintf(stderr, "fake stream: wait for %u never satisfied; giving up\n", op->value);
                break;
            }
            nanosleep(&nap, NULL);
        }
        break;
    }
    case FAKE_OP_HOST_FN:
        op->fn(op->arg);
        break;
    case FAKE_OP_RECORD:
        pthread_mutex_lock(&fake_lock);
        if (op->stamp > op->event->completed) op->event->completed = op->stamp;
        pthread_cond_broadcast(&fake_event_changed);
        pthread_mutex_unlock(&fake_lock);
        break;
    }
}

static void *fake_stream_main(void *arg) {
    struct fake_stream *s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (!s->head && !s->closing) pthread_cond_wait(&s->changed, &s->lock);
        struct fake_op *op = s->head;
        if (!op) break; /* closing, and everything enqueued has run */
        s->head = op->next;
        if (!s->head) s->tail = NULL;
        pthread_mutex_unlock(&s->lock);
        fake_run_op(op);
        free(op);
        pthread_mutex_lock(&s->lock);
        s->finished++;
        pthread_cond_broadcast(&s->changed);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

static struct fake_stream *fake_stream_start(void) {
    struct fake_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->changed, NULL);
    if (pthread_create(&s->thread, NULL, fake_stream_main, s) != 0) {
        free(s);
        return NULL;
    }
    return s;
}

static void fake_default_start(void) { fake_default_stream = fake_stream_start(); }

/* A new stream, registered as a valid handle; NULL when out of room. */
__attribute__((unused)) static struct fake_stream *fake_stream_create(void) {
    struct fake_stream *s = fake_stream_start();
    if (!s) return NULL;
    pthread_mutex_lock(&fake_lock);
    int slot = -1;
    for (int i = 0; i < FAKE_MAX_STREAMS && slot < 0; i++)
        if (!fake_streams[i]) slot = i;
    if (slot >= 0) fake_streams[slot] = s;
    pthread_mutex_unlock(&fake_lock);
    if (slot < 0) {
        pthread_mutex_lock(&s->lock);
        s->closing = 1;
        pthread_cond_broadcast(&s->changed);
        pthread_mutex_unlock(&s->lock);
        pthread_join(s->thread, NULL);
        free(s);
        return NULL;
    }
    return s;
}

/* The stream behind a handle: 0, 0x1 (legacy) and 0x2 (per-thread) are the one default
 * stream; anything else must be a live stream from fake_stream_create (else NULL). */
static struct fake_stream *fake_stream_get(void *handle) {
    if ((uintptr_t)handle <= 2) {
        pthread_once(&fake_default_once, fake_default_start);
        return fake_default_stream;
    }
    struct fake_stream *found = NULL;
    pthread_mutex_lock(&fake_lock);
    for (int i = 0; i < FAKE_MAX_STREAMS; i++)
        if (fake_streams[i] == handle) found = fake_streams[i];
    pthread_mutex_unlock(&fake_lock);
    return found;
}

/* Runs what is enqueued, then stops the stream's thread and frees it. -1: unknown handle. */
__attribute__((unused)) static int fake_stream_destroy(void *handle) {
    struct fake_stream *s = NULL;
    pthread_mutex_lock(&fake_lock);
    for (int i = 0; i < FAKE_MAX_STREAMS; i++)
        if (fake_streams[i] == handle) {
            s = fake_streams[i];
            fake_streams[i] = NULL;
        }
    pthread_mutex_unlock(&fake_lock);
    if (!s) return -1;
    pthread_mutex_lock(&s->lock);
    s->closing = 1;
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    free(s);
    return 0;
}

/* Waits until everything enqueued so far has run. -1: unknown handle or FAKE_LIMIT_S passed. */
__attribute__((unused)) static int fake_stream_sync(void *handle) {
    struct fake_stream *s = fake_stream_get(handle);
    if (!s) return -1;
    struct timespec limit = fake_deadline();
    int rc = 0;
    pthread_mutex_lock(&s->lock);
    unsigned long target = s->enqueued;
    while (s->finished < target && rc == 0)
        rc = pthread_cond_timedwait(&s->changed, &s->lock, &limit);
    pthread_mutex_unlock(&s->lock);
    return rc == 0 ? 0 : -1;
}

/* Appends an op (copied); -1: unknown handle or no memory. */
static int fake_stream_push(void *handle, struct fake_op op) {
    struct fake_stream *s = fake_stream_get(handle);
    struct fake_op *node = s ? malloc(sizeof *node) : NULL;
    if (!node) return -1;
    *node = op;
    node->next = NULL;
    pthread_mutex_lock(&s->lock);
    if (s->tail) s->tail->next = node; else s->head = node;
    s->tail = node;
    s->enqueued++;
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->lock);
    return 0;
}

/* An async copy; counts a host side that is neither registered nor device memory. */
__attribute__((unused)) static int fake_enqueue_copy(void *handle, uintptr_t dst, uintptr_t src, size_t len) {
    if (!fake_stream_get(handle) || fake_copy_refused(dst, src, len)) return -1;
    int pageable = (!fake_is_device(dst) && !fake_is_registered_range(dst, len)) ||
                   (!fake_is_device(src) && !fake_is_registered_range(src, len));
    if (pageable) __atomic_add_fetch(&fake_pageable_async_sources, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&fake_async_copies, 1, __ATOMIC_RELAXED);
    return fake_stream_push(handle, (struct fake_op){.kind = FAKE_OP_COPY, .dst = dst, .src = src, .len = len});
}

/* Later ops wait until the 4-byte word at `addr` (registered host or device memory) equals
 * `value`. -1: unknown handle, or a word the device could not see. */
__attribute__((unused)) static int fake_enqueue_wait(void *handle, uintptr_t addr, uint32_t value) {
    if (addr % 4 || (!fake_is_device(addr) && !fake_is_registered_range(addr, 4))) return -1;
    if (!fake_stream_get(handle)) return -1;
    __atomic_add_fetch(&fake_waits, 1, __ATOMIC_RELAXED);
    return fake_stream_push(handle, (struct fake_op){.kind = FAKE_OP_WAIT, .dst = addr, .value = value});
}

__attribute__((unused)) static int fake_enqueue_host_fn(void *handle, void (*fn)(void *), void *arg) {
    if (!fn || !fake_stream_get(handle)) return -1;
    __atomic_add_fetch(&fake_host_fns, 1, __ATOMIC_RELAXED);
    return fake_stream_push(handle, (struct fake_op){.kind = FAKE_OP_HOST_FN, .fn = fn, .arg = arg});
}

__attribute__((unused)) static int fake_event_record(struct fake_event *e, void *handle) {
    if (!e || !fake_stream_get(handle)) return -1;
    pthread_mutex_lock(&fake_lock);
    unsigned long stamp = ++e->recorded;
    pthread_mutex_unlock(&fake_lock);
    return fake_stream_push(handle, (struct fake_op){.kind = FAKE_OP_RECORD, .event = e, .stamp = stamp});
}

/* 1 when the stream reached the event's last record (or it was never recorded). */
__attribute__((unused)) static int fake_event_done(struct fake_event *e) {
    pthread_mutex_lock(&fake_lock);
    int done = e->completed >= e->recorded;
    pthread_mutex_unlock(&fake_lock);
    return done;
}

/* Waits for the event's last record; -1 after FAKE_LIMIT_S. */
__attribute__((unused)) static int fake_event_sync(struct fake_event *e) {
    struct timespec limit = fake_deadline();
    int rc = 0;
    pthread_mutex_lock(&fake_lock);
    while (e->completed < e->recorded && rc == 0)
        rc = pthread_cond_timedwait(&fake_event_changed, &fake_lock, &limit);
    pthread_mutex_unlock(&fake_lock);
    return rc == 0 ? 0 : -1;
}

/* 1 while the stream is marked as being captured, 0 if not, -1 for an unknown handle. */
__attribute__((unused)) static int fake_stream_capturing(void *handle) {
    struct fake_stream *s = fake_stream_get(handle);
    return s ? __atomic_load_n(&s->capturing, __ATOMIC_ACQUIRE) : -1;
}

/* Test hook: marks a stream as being captured (on != 0) or not. -1 for an unknown handle. */
int fake_stream_set_capturing(void *handle, int on) {
    struct fake_stream *s = fake_stream_get(handle);
    if (!s) return -1;
    __atomic_store_n(&s->capturing, on != 0, __ATOMIC_RELEASE);
    return 0;
}
#endif /* STANDIN_NO_STREAMS */
