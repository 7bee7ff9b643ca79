/* Test-only stand-in for libascendcl.so over the fake device of fake_device.h. Pointer
 * queries fail for memory ACL does not know (as documented), and aclrtMemcpy(Async) checks
 * that the copy kind matches the pointers. -DSTANDIN_NO_STREAMS leaves out streams. */
#include "fake_device.h"

typedef int aclError;
#define FAKE_CONTEXT ((void *)0xacc)
static __thread void *current;

aclError aclInit(const char *config) { (void)config; return fake_setup() ? 0 : 500000; }
aclError aclrtSetDevice(int dev) { if (dev) return 107001; current = FAKE_CONTEXT; return 0; }
aclError aclrtGetCurrentContext(void **ctx) { if (!current) return 107002; *ctx = current; return 0; }
aclError aclrtSetCurrentContext(void *ctx) { if (ctx != FAKE_CONTEXT) return 107002; current = ctx; return 0; }

aclError aclrtPointerGetAttributes(const void *ptr, unsigned *attrs) {
    if (!current) return 107002;
    if (fake_is_device((uintptr_t)ptr)) { attrs[0] = 0; attrs[1] = 1; attrs[2] = 4096; return 0; }
    if (fake_is_registered((uintptr_t)ptr)) { attrs[0] = 0; attrs[1] = 0; attrs[2] = 4096; return 0; }
    return 107000; /* not ACL memory */
}

/* 0 when `kind` (aclrtMemcpyKind) matches the pointers and the count fits. */
static aclError check_copy(void *dst, size_t dest_max, const void *src, size_t count, int kind) {
    if (!current) return 107002;
    int d = fake_is_device((uintptr_t)dst), s = fake_is_device((uintptr_t)src);
    int want = d && s ? 3 : d ? 1 : s ? 2 : 0;
    return kind != want || count > dest_max ? 100000 : 0;
}

aclError aclrtMemcpy(void *dst, size_t dest_max, const void *src, size_t count, int kind) {
    aclError rc = check_copy(dst, dest_max, src, count, kind);
    if (rc == 0 && fake_copy_refused((uintptr_t)dst, (uintptr_t)src, count)) rc = 100000;
    if (rc == 0) fake_copy((uintptr_t)dst, (uintptr_t)src, count);
    return rc;
}

aclError aclrtMalloc(void **ptr, size_t len, int policy) {
    uintptr_t p;
    (void)policy;
    if (!fake_alloc(len, &p)) return 207001;
    *ptr = (void *)p;
    return 0;
}
aclError aclrtFree(void *ptr) { return fake_is_device((uintptr_t)ptr) ? 0 : 107000; }

aclError aclrtHostRegister(void *p, unsigned long long len, int type, void **dev) {
    if (!current) return 107002;
    if (type != 0) return 100000;
    if (fake_register((uintptr_t)p, len)) return 207000;
    *dev = p;
    return 0;
}
aclError aclrtHostUnregister(void *p) { return fake_unregister((uintptr_t)p) ? 100000 : 0; }

#ifndef STANDIN_NO_STREAMS
/* Streams over the fake streams (107003: stream not usable; 507899: internal error). */
aclError aclrtCreateStream(void **stream) {
    struct fake_stream *s = fake_stream_create();
    if (!s) return 207001;
    *stream = s;
    return 0;
}
aclError aclrtDestroyStream(void *stream) { return fake_stream_destroy(stream) ? 107003 : 0; }
aclError aclrtSynchronizeStream(void *stream) {
    if (!fake_stream_get(stream)) return 107003;
    return fake_stream_sync(stream) ? 507899 : 0;
}
aclError aclrtMemcpyAsync(void *dst, size_t dest_max, const void *src, size_t count, int kind, void *stream) {
    aclError rc = check_copy(dst, dest_max, src, count, kind);
    if (rc) return rc;
    return fake_enqueue_copy(stream, (uintptr_t)dst, (uintptr_t)src, count) ? 107003 : 0;
}
aclError aclrtLaunchHostFunc(void *stream, void (*fn)(void *), void *args) {
    if (!current) return 107002;
    return fake_enqueue_host_fn(stream, fn, args) ? 107003 : 0;
}
aclError aclmdlRICaptureGetInfo(void *stream, int *status, void **model) {
    if (!current) return 107002;
    int capturing = fake_stream_capturing(stream);
    if (capturing < 0) return 107003;
    *status = capturing; /* ACL_MODEL_RI_CAPTURE_STATUS_NONE / _ACTIVE */
    *model = capturing ? stream : NULL;
    return 0;
}
#endif
