/* Test-only stand-in for libcuda.so: the driver calls mooncake-rs makes, over the fake
 * device of fake_device.h. Build with -DSTANDIN_NO_HOST_REGISTER to leave out the host
 * registration symbols; FAKE_CUDA_NO_DEVICE=1 makes cuInit report no device. */
#include "fake_device.h"

typedef int CUresult;
enum { OK = 0, INVALID_VALUE = 1, NOT_INITIALIZED = 3, NO_DEVICE = 100, INVALID_DEVICE = 101,
       INVALID_CONTEXT = 201, ALREADY_REGISTERED = 712, NOT_REGISTERED = 713 };
#define FAKE_CONTEXT ((void *)0x5eed)

static int initialised;
static __thread int depth; /* pushed contexts on this thread */

CUresult cuInit(unsigned flags) {
    (void)flags;
    if (getenv("FAKE_CUDA_NO_DEVICE")) return NO_DEVICE;
    if (!fake_setup()) return NOT_INITIALIZED;
    initialised = 1;
    return OK;
}
CUresult cuDriverGetVersion(int *v) { *v = 12080; return OK; }
CUresult cuDeviceGetCount(int *n) { if (!initialised) return NOT_INITIALIZED; *n = 1; return OK; }
CUresult cuDeviceGet(int *dev, int ordinal) { if (ordinal != 0) return INVALID_DEVICE; *dev = 0; return OK; }
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) { if (dev) return INVALID_DEVICE; *ctx = FAKE_CONTEXT; return OK; }
CUresult cuDevicePrimaryCtxRelease_v2(int dev) { (void)dev; return OK; }
CUresult cuCtxPushCurrent_v2(void *ctx) { if (ctx != FAKE_CONTEXT) return INVALID_CONTEXT; depth++; return OK; }
CUresult cuCtxPopCurrent_v2(void **ctx) {
    if (depth == 0) return INVALID_CONTEXT;
    depth--;
    if (ctx) *ctx = FAKE_CONTEXT;
    return OK;
}

/* Unknown host pointers succeed with memory type 0, like the real driver. */
CUresult cuPointerGetAttributes(unsigned n, int *attrs, void **data, unsigned long long ptr) {
    if (depth == 0) return INVALID_CONTEXT;
    for (unsigned i = 0; i < n; i++) {
        switch (attrs[i]) {
        case 2: /* MEMORY_TYPE */
            *(unsigned *)data[i] = fake_is_device(ptr) ? 2 : fake_is_registered(ptr) ? 1 : 0;
            break;
        case 9: /* DEVICE_ORDINAL */
            *(int *)data[i] = fake_is_device(ptr) ? 0 : -2;
            break;
        default:
            return INVALID_VALUE;
        }
    }
    return OK;
}

CUresult cuMemcpy(unsigned long long dst, unsigned long long src, size_t len) {
    if (depth == 0) return INVALID_CONTEXT;
    fake_copy(dst, src, len);
    return OK;
}

CUresult cuMemAlloc_v2(unsigned long long *ptr, size_t len) {
    uintptr_t p;
    if (depth == 0) return INVALID_CONTEXT;
    if (!fake_alloc(len, &p)) return 2; /* OUT_OF_MEMORY */
    *ptr = p;
    return OK;
}
CUresult cuMemFree_v2(unsigned long long ptr) { return fake_is_device(ptr) ? OK : INVALID_VALUE; }

#ifndef STANDIN_NO_HOST_REGISTER
CUresult cuMemHostRegister_v2(void *p, size_t len, unsigned flags) {
    if (depth == 0) return INVALID_CONTEXT;
    if (flags != 3) return INVALID_VALUE; /* we always ask for PORTABLE | DEVICEMAP */
    int rc = fake_register((uintptr_t)p, len);
    return rc == 0 ? OK : rc == 1 ? 2 /* OUT_OF_MEMORY */ : ALREADY_REGISTERED;
}
CUresult cuMemHostUnregister(void *p) {
    if (depth == 0) return INVALID_CONTEXT;
    return fake_unregister((uintptr_t)p) ? NOT_REGISTERED : OK;
}
#endif
