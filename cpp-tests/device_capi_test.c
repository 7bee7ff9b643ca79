/* Device pointers through the C APIs (mc_* and mooncake_store_*), against the test-only
 * stand-in CUDA driver (tests/standin/cuda_standin.c, built as libcuda.so and found through
 * LD_LIBRARY_PATH). Its device memory is PROT_NONE: a host memcpy on it would crash here. */
#include <dlfcn.h>
#include <mooncake_rs.h>
#include <stdio.h>
#include <stdlib.h>
#include <store_c.h>
#include <string.h>

#define CHECK(cond)                                                                 \
    do {                                                                            \
        if (!(cond)) {                                                              \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            return 1;                                                               \
        }                                                                           \
    } while (0)

typedef int (*retain_fn)(void **, int);
typedef int (*push_fn)(void *);
typedef int (*alloc_fn)(unsigned long long *, size_t);
typedef int (*copy_fn)(unsigned long long, unsigned long long, size_t);

enum { N = 300 * 1024 + 11 };
static char host_in[N], host_out[N], json[16384];

int main(void) {
    void *cuda = dlopen("libcuda.so", RTLD_NOW);
    CHECK(cuda != NULL);
    retain_fn retain = (retain_fn)dlsym(cuda, "cuDevicePrimaryCtxRetain");
    push_fn push = (push_fn)dlsym(cuda, "cuCtxPushCurrent_v2");
    alloc_fn alloc = (alloc_fn)dlsym(cuda, "cuMemAlloc_v2");
    copy_fn copy = (copy_fn)dlsym(cuda, "cuMemcpy");
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(cuda, "cuInit");
    CHECK(retain && push && alloc && copy && init);
    void *ctx = NULL;
    CHECK(init(0) == 0 && retain(&ctx, 0) == 0 && push(ctx) == 0);
    unsigned long long src = 0, dst[2] = {0, 0};
    CHECK(alloc(&src, N) == 0 && alloc(&dst[0], N) == 0 && alloc(&dst[1], N) == 0);
    for (size_t i = 0; i < N; i++) host_in[i] = (char)(i * 7 + 3);
    CHECK(copy(src, (unsigned long long)(size_t)host_in, N) == 0);

    mc_store_t *store = mc_store_new();
    mc_setup_config_t cfg;
    mc_setup_config_init(&cfg);
    cfg.local_hostname = "device-capi";
    cfg.global_segment_size = 64u << 20;
    cfg.local_buffer_size = 16u << 20;
    cfg.master_server_addr = "embedded";
    CHECK(mc_store_setup(store, &cfg) == 0);

    /* mc_*: put_from and get_into with device pointers on both sides. */
    CHECK(mc_store_put_from(store, "k", (const void *)(size_t)src, N, NULL) == 0);
    CHECK(mc_store_get_into(store, "k", (void *)(size_t)dst[0], N) == N);
    CHECK(copy((unsigned long long)(size_t)host_out, dst[0], N) == 0);
    CHECK(memcmp(host_in, host_out, N) == 0);

    /* mooncake_store_*: the same through Mooncake's API, then a batch get into two devices. */
    mooncake_store_t m = (mooncake_store_t)store;
    CHECK(mooncake_store_put_from(m, "k2", (void *)(size_t)src, N, NULL) == 0);
    CHECK(mooncake_store_get_into(m, "k2", (void *)(size_t)dst[1], N) == N);
    const char *keys[2] = {"k", "k2"};
    void *bufs[2] = {(void *)(size_t)dst[0], (void *)(size_t)dst[1]};
    size_t sizes[2] = {N, N};
    int64_t results[2] = {0, 0};
    CHECK(mooncake_store_batch_get_into(m, keys, bufs, sizes, 2, results) == 0);
    CHECK(results[0] == N && results[1] == N);
    CHECK(copy((unsigned long long)(size_t)host_out, dst[1], N) == 0);
    CHECK(memcmp(host_in, host_out, N) == 0);

    /* The counters say which path ran. */
    size_t needed = 0;
    CHECK(mc_store_metrics_json(store, json, sizeof json, &needed) == 0);
    CHECK(strstr(json, "\"runtime\":\"cuda\"") != NULL);
    CHECK(strstr(json, "\"device_to_local_segment\":{\"ops\":2") != NULL);
    CHECK(strstr(json, "\"local_segment_to_device\":{\"ops\":4") != NULL);
    mc_store_free(store);
    puts("device_capi_test: ok");
    return 0;
}
