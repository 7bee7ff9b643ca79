/* store_c_compat.c: Mooncake's existing C API (store_c.h, mooncake_store_*) against
 * libmooncake_rs.so, used exactly as Mooncake's header declares it. A program written for
 * libmooncake_store.so builds and runs unchanged; only the library it links differs.
 *
 * Embedded master (master_server_addr "embedded"), so no other process is needed.
 * Exit status 0 when every check holds; each failed check prints its line.
 */
#include <store_c.h>

#include "example_check.h"
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static void fill(unsigned char *buf, size_t len, unsigned seed) {
    for (size_t i = 0; i < len; i++) buf[i] = (unsigned char)(i * 31u + seed);
}

static void single_key(mooncake_store_t store) {
    static unsigned char value[4096], out[4096];
    fill(value, sizeof value, 7);
    EXPECT_EQ(mooncake_store_put(store, "compat/one", value, sizeof value, NULL), 0);
    EXPECT_EQ(mooncake_store_is_exist(store, "compat/one"), 1);
    EXPECT_EQ(mooncake_store_get_size(store, "compat/one"), (long long)sizeof value);
    EXPECT_EQ(mooncake_store_get_into(store, "compat/one", out, sizeof out), (long long)sizeof out);
    EXPECT_EQ(memcmp(out, value, sizeof value), 0);
    /* Buffer too small is INVALID_PARAMS (-600), missing key OBJECT_NOT_FOUND (-704). */
    EXPECT_EQ(mooncake_store_get_into(store, "compat/one", out, 16), -600);
    EXPECT_EQ(mooncake_store_get_into(store, "compat/missing", out, sizeof out), -704);
    EXPECT_EQ(mooncake_store_is_exist(store, "compat/missing"), 0);
    /* is_exist granted a lease: a plain remove is refused, a forced one wins. */
    EXPECT_EQ(mooncake_store_remove(store, "compat/one", 0), -706);
    EXPECT_EQ(mooncake_store_remove(store, "compat/one", 1), 0);
    EXPECT_EQ(mooncake_store_is_exist(store, "compat/one"), 0);
}

static void batches(mooncake_store_t store) {
    static unsigned char a[1000], b[3000], out_a[1000], out_b[3000];
    fill(a, sizeof a, 1);
    fill(b, sizeof b, 2);
    EXPECT_EQ(mooncake_store_register_buffer(store, a, sizeof a), 0);
    const char *keys[2] = {"compat/batch/a", "compat/batch/b"};
    void *bufs[2] = {a, b};
    size_t sizes[2] = {sizeof a, sizeof b};
    int put_results[2] = {99, 99};
    mooncake_replicate_config_t config = {1, 0, 0, NULL, 0};
    EXPECT_EQ(mooncake_store_batch_put_from(store, keys, bufs, sizes, 2, &config, put_results), 0);
    EXPECT_EQ(put_results[0], 0);
    EXPECT_EQ(put_results[1], 0);

    void *outs[2] = {out_a, out_b};
    int64_t get_results[2] = {0, 0};
    EXPECT_EQ(mooncake_store_batch_get_into(store, keys, outs, sizes, 2, get_results), 0);
    EXPECT_EQ(get_results[0], (long long)sizeof a);
    EXPECT_EQ(get_results[1], (long long)sizeof b);
    EXPECT_EQ(memcmp(out_a, a, sizeof a), 0);
    EXPECT_EQ(memcmp(out_b, b, sizeof b), 0);

    const char *probe[3] = {"compat/batch/a", "compat/nothing", "compat/batch/b"};
    int exist[3] = {-1, -1, -1};
    EXPECT_EQ(mooncake_store_batch_is_exist(store, probe, 3, exist), 0);
    EXPECT_EQ(exist[0], 1);
    EXPECT_EQ(exist[1], 0);
    EXPECT_EQ(exist[2], 1);
    EXPECT_EQ(mooncake_store_unregister_buffer(store, a), 0);

    EXPECT_EQ(mooncake_store_remove_by_regex(store, "^compat/batch/", 1), 2);
    EXPECT_EQ(mooncake_store_put(store, "compat/last", "x", 1, NULL), 0);
    EXPECT_EQ(mooncake_store_remove_all(store, 1), 1);
}

static void argument_checks(mooncake_store_t store) {
    /* The C wrapper's own checks return -1 (spec: NULL store/key, value NULL with size > 0). */
    EXPECT_EQ(mooncake_store_put(NULL, "k", "v", 1, NULL), -1);
    EXPECT_EQ(mooncake_store_put(store, NULL, "v", 1, NULL), -1);
    EXPECT_EQ(mooncake_store_put(store, "k", NULL, 1, NULL), -1);
    EXPECT_EQ(mooncake_store_health_check(NULL), -1);
    EXPECT_EQ(mooncake_store_register_buffer(store, NULL, 16), -1);
    char tiny[2];
    EXPECT_EQ(mooncake_store_get_hostname(store, tiny, sizeof tiny), -1);
    /* replica_num = 0 is copied verbatim and rejected with INVALID_PARAMS. */
    mooncake_replicate_config_t zero = {0, 0, 0, NULL, 0};
    EXPECT_EQ(mooncake_store_put(store, "compat/zero", "v", 1, &zero), -600);
}

int main(void) {
    mooncake_store_t store = mooncake_store_create();
    if (store == NULL) {
        fprintf(stderr, "mooncake_store_create returned NULL\n");
        return 1;
    }
    EXPECT_EQ(mooncake_store_health_check(store), 1); /* not initialised yet */
    int rc = mooncake_store_setup(store, "localhost", "P2PHANDSHAKE", 16u << 20, 16u << 20, "tcp",
                                  "", "embedded");
    EXPECT_EQ(rc, 0);
    if (rc == 0) {
        EXPECT_EQ(mooncake_store_health_check(store), 0);
        char hostname[256];
        EXPECT_EQ(mooncake_store_get_hostname(store, hostname, sizeof hostname), 0);
        EXPECT_EQ(hostname[0] != '\0', 1);
        single_key(store);
        batches(store);
        argument_checks(store);
    }
    mooncake_store_destroy(store);
    mooncake_store_destroy(NULL); /* NULL-safe */
    return example_exit_status("store_c_compat");
}
