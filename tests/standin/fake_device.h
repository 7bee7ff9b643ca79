/* Test-only fake accelerator shared by the CUDA and Ascend stand-in driver libraries.
 *
 * "Device memory" is an address range the host cannot touch: a PROT_NONE mapping of a memfd.
 * The stand-in's own copy functions reach the same pages through a second, read-write
 * mapping, so any plain memcpy on a device pointer outside the driver crashes the test
 * (SIGSEGV) while driver copies work. Host registrations are recorded so pointer queries
 * can report pinned host memory. Never shipped: built by tests/device_standin.rs. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
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

static int fake_is_registered(uintptr_t p) {
    int found = 0;
    pthread_mutex_lock(&fake_lock);
    for (int i = 0; i < FAKE_MAX_REGS; i++)
        if (fake_regs[i].len && p >= fake_regs[i].base && p < fake_regs[i].base + fake_regs[i].len)
            found = 1;
    pthread_mutex_unlock(&fake_lock);
    return found;
}

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
