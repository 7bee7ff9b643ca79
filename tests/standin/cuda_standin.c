/* Test-only stand-in for libcuda.so: the driver calls mooncake-rs makes, over the fake
 * device of fake_device.h. Build with -DSTANDIN_NO_HOST_REGISTER to leave out the host
 * registration symbols, -DSTANDIN_NO_STREAMS to leave out streams and events;
 * FAKE_CUDA_NO_DEVICE=1 makes cuInit report no device. */
#include "fake_device.h"

typedef int CUresult;
enum { OK = 0, INVALID_VALUE = 1, NOT_INITIALIZED = 3, NO_DEVICE = 100, INVALID_DEVICE = 101,
       INVALID_CONTEXT = 201, INVALID_HANDLE = 400, NOT_READY = 600, ALREADY_REGISTERED = 712,
       NOT_REGISTERED = 713, UNKNOWN = 999 };
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
    if (fake_copy_refused(dst, src, len)) return INVALID_VALUE;
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

#ifndef STANDIN_NO_STREAMS
/* Streams and events over the fake streams. Calls the library makes on a caller's stream
 * need a current context (as on the real driver); the test's own stream management does not. */
static __thread int capture_mode; /* CU_STREAM_CAPTURE_MODE_GLOBAL */

CUresult cuStreamCreate(void **stream, unsigned flags) {
    (void)flags;
    struct fake_stream *s = fake_stream_create();
    if (!s) return 2; /* OUT_OF_MEMORY */
    *stream = s;
    return OK;
}
CUresult cuStreamDestroy_v2(void *stream) { return fake_stream_destroy(stream) ? INVALID_HANDLE : OK; }
CUresult cuStreamSynchronize(void *stream) {
    if (!fake_stream_get(stream)) return INVALID_HANDLE;
    return fake_stream_sync(stream) ? UNKNOWN : OK;
}
CUresult cuStreamGetCtx(void *stream, void **ctx) {
    if (!fake_stream_get(stream)) return INVALID_HANDLE;
    *ctx = FAKE_CONTEXT;
    return OK;
}
CUresult cuStreamIsCapturing(void *stream, int *status) {
    if (depth == 0) return INVALID_CONTEXT;
    int capturing = fake_stream_capturing(stream);
    if (capturing < 0) return INVALID_HANDLE;
    *status = capturing; /* CU_STREAM_CAPTURE_STATUS_NONE / _ACTIVE */
    return OK;
}
CUresult cuThreadExchangeStreamCaptureMode(int *mode) {
    if (*mode < 0 || *mode > 2) return INVALID_VALUE;
    int previous = capture_mode;
    capture_mode = *mode;
    *mode = previous;
    return OK;
}
/* Registered host memory is mapped at its own address; anything else is refused. */
CUresult cuMemHostGetDevicePointer_v2(unsigned long long *dptr, void *p, unsigned flags) {
    if (depth == 0) return INVALID_CONTEXT;
    if (flags != 0 || !fake_is_registered((uintptr_t)p)) return INVALID_VALUE;
    *dptr = (uintptr_t)p;
    return OK;
}
CUresult cuStreamWaitValue32_v2(void *stream, unsigned long long addr, uint32_t value, unsigned flags) {
    if (depth == 0) return INVALID_CONTEXT;
    if (flags != 1) return INVALID_VALUE; /* only CU_STREAM_WAIT_VALUE_EQ is faked */
    return fake_enqueue_wait(stream, addr, value) ? INVALID_VALUE : OK;
}
CUresult cuMemcpyAsync(unsigned long long dst, unsigned long long src, size_t len, void *stream) {
    if (depth == 0) return INVALID_CONTEXT;
    return fake_enqueue_copy(stream, dst, src, len) ? INVALID_HANDLE : OK;
}
CUresult cuLaunchHostFunc(void *stream, void (*fn)(void *), void *arg) {
    if (depth == 0) return INVALID_CONTEXT;
    return fake_enqueue_host_fn(stream, fn, arg) ? INVALID_VALUE : OK;
}

CUresult cuEventCreate(void **event, unsigned flags) {
    (void)flags;
    *event = calloc(1, sizeof(struct fake_event));
    return *event ? OK : 2;
}
CUresult cuEventRecord(void *event, void *stream) { return fake_event_record(event, stream) ? INVALID_HANDLE : OK; }
CUresult cuEventQuery(void *event) { return fake_event_done(event) ? OK : NOT_READY; }
CUresult cuEventSynchronize(void *event) { return fake_event_sync(event) ? UNKNOWN : OK; }
CUresult cuEventDestroy_v2(void *event) { free(event); return OK; }
#endif
