/* quickstart.c: the mooncake-rs C API on one page.
 *
 * An embedded store (master and client in this process, no sockets): put a value, read it back,
 * write and read a batch, remove. Every call returns 0 (or a byte count) on success and a negative
 * Mooncake error code otherwise; mc_strerror() names the code.
 *
 *   cc -std=c11 quickstart.c $(pkg-config --cflags --libs mooncake_rs) -o quickstart
 */
#include <mooncake_rs.h>
#include <stdio.h>
#include <string.h>

#define CHECK(expr)                                                                           \
    do {                                                                                      \
        long long rc_ = (long long)(expr);                                                    \
        if (rc_ < 0) {                                                                        \
            fprintf(stderr, "%s failed: %lld %s\n", #expr, rc_, mc_strerror((int64_t)rc_));  \
            return 1;                                                                         \
        }                                                                                     \
    } while (0)

static int run(mc_store_t *store) {
    mc_setup_config_t config;
    mc_setup_config_init(&config);
    config.master_server_addr = "embedded";
    CHECK(mc_store_setup(store, &config));

    const char *greeting = "hello, mooncake";
    CHECK(mc_store_put(store, "greeting", greeting, strlen(greeting), NULL));
    char out[64];
    int64_t n = mc_store_get_into(store, "greeting", out, sizeof out);
    CHECK(n);
    printf("greeting = %.*s\n", (int)n, out);

    const char *keys[2] = {"layer.0", "layer.1"};
    const void *values[2] = {"alpha", "beta"};
    size_t sizes[2] = {5, 4};
    CHECK(mc_store_put_batch(store, keys, values, sizes, 2, NULL));
    char a[8], b[8];
    void *bufs[2] = {a, b};
    size_t caps[2] = {sizeof a, sizeof b};
    int64_t got[2];
    CHECK(mc_store_batch_get_into(store, keys, bufs, caps, 2, got));
    CHECK(got[0]); /* per-key byte count or error code */
    CHECK(got[1]);
    printf("layer.0 = %.*s, layer.1 = %.*s\n", (int)got[0], a, (int)got[1], b);

    /* Reads grant a read lease (10 s) that blocks a plain remove (-706); force overrides it. */
    CHECK(mc_store_remove(store, "greeting", 1));
    int exists = mc_store_is_exist(store, "greeting");
    printf("after remove: is_exist = %d\n", exists);
    int same = n == (int64_t)strlen(greeting) && memcmp(out, greeting, (size_t)n) == 0 &&
               got[0] == 5 && memcmp(a, "alpha", 5) == 0 && got[1] == 4 && memcmp(b, "beta", 4) == 0;
    return same && exists == 0 ? 0 : 1;
}

int main(void) {
    mc_store_t *store = mc_store_new();
    if (store == NULL) {
        fprintf(stderr, "mc_store_new failed\n");
        return 1;
    }
    int status = run(store);
    mc_store_free(store); /* tears down; objects of an embedded store go with it */
    return status;
}
