/* standalone.c: the standalone layout. One long-lived `mooncake_client` (the real client) owns
 * the host's DRAM segment; worker processes attach to it as *dummies* and reach the pool through
 * it over shared memory.
 *
 *   standalone <path/to/mooncake_master> <path/to/mooncake_client>
 *   (or MOONCAKE_MASTER_BIN / MOONCAKE_CLIENT_BIN in the environment)
 *
 * Starts the master and the real client (which prints "READY <segment name>"), then this process
 * attaches with mc_store_setup_dummy(store, 0, local buffer size, "<segment name>"), allocates
 * shared memory with mc_shm_alloc, registers it (zero-copy), and runs puts and gets of every
 * family through the real client; memory outside shared memory works too (staged, one copy) but
 * cannot be registered (-600). Every wait is bounded; the children are killed and reaped.
 */
#define _POSIX_C_SOURCE 200809L
#include <mooncake_rs.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "example_check.h"
#include "example_proc.h"

enum { VALUE = 256 << 10 };

static void fill(unsigned char *buf, size_t len, unsigned seed) {
    for (size_t i = 0; i < len; i++) buf[i] = (unsigned char)((i * 131u) ^ seed);
}

static void worker(mc_store_t *store) {
    EXPECT_EQ(mc_store_health_check(store), 0);

    /* The framework's host pool lives in shared memory the real client maps: zero-copy. */
    unsigned char *pool = mc_shm_alloc(4 * VALUE);
    EXPECT_EQ(pool != NULL, 1);
    if (pool == NULL) return;
    EXPECT_EQ(mc_store_register_buffer(store, pool, 4 * VALUE), 0);
    fill(pool, VALUE, 1);
    fill(pool + VALUE, VALUE, 2);
    EXPECT_EQ(mc_store_put_from(store, "sa/zero-copy", pool, VALUE, NULL), 0);
    EXPECT_EQ(mc_store_get_into(store, "sa/zero-copy", pool + 2 * VALUE, VALUE), VALUE);
    EXPECT_EQ(memcmp(pool, pool + 2 * VALUE, VALUE), 0);

    /* Batches. */
    const char *keys[2] = {"sa/batch-0", "sa/batch-1"};
    const void *srcs[2] = {pool, pool + VALUE};
    void *dsts[2] = {pool + 2 * VALUE, pool + 3 * VALUE};
    size_t sizes[2] = {VALUE, VALUE};
    int put_results[2] = {1, 1};
    int64_t get_results[2] = {0, 0};
    EXPECT_EQ(mc_store_batch_put_from(store, keys, srcs, sizes, 2, NULL, put_results), 0);
    EXPECT_EQ(put_results[0] == 0 && put_results[1] == 0, 1);
    memset(pool + 2 * VALUE, 0, 2 * VALUE);
    EXPECT_EQ(mc_store_batch_get_into(store, keys, dsts, sizes, 2, get_results), 0);
    EXPECT_EQ(get_results[0] == VALUE && get_results[1] == VALUE, 1);
    EXPECT_EQ(memcmp(pool, pool + 2 * VALUE, 2 * VALUE), 0);

    /* Multi-buffer: one object from two buffers, read back into two others. */
    const char *mkey[1] = {"sa/multi"};
    const void *parts[2] = {pool, pool + VALUE};
    const void *const *part_list[1] = {parts};
    size_t part_sizes[2] = {1000, 3000};
    const size_t *size_list[1] = {part_sizes};
    size_t counts[1] = {2};
    EXPECT_EQ(mc_store_batch_put_from_multi_buffers(store, mkey, 1, part_list, size_list, counts,
                                                    NULL, put_results),
              0);
    EXPECT_EQ(put_results[0], 0);
    void *outs[2] = {pool + 2 * VALUE, pool + 3 * VALUE};
    void *const *out_list[1] = {outs};
    size_t out_sizes[2] = {3000, 1000};
    const size_t *out_size_list[1] = {out_sizes};
    EXPECT_EQ(mc_store_batch_get_into_multi_buffers(store, mkey, 1, out_list, out_size_list,
                                                    counts, get_results),
              0);
    EXPECT_EQ(get_results[0], 4000);
    EXPECT_EQ(memcmp(pool + 2 * VALUE, pool, 1000), 0);
    EXPECT_EQ(memcmp(pool + 2 * VALUE + 1000, pool + VALUE, 2000), 0);
    EXPECT_EQ(memcmp(pool + 3 * VALUE, pool + VALUE + 2000, 1000), 0);

    /* Ranges, into ordinary (not shared) memory: staged through the dummy's shared block. */
    static unsigned char heap[VALUE];
    void *buffers[1] = {heap};
    size_t buffer_sizes[1] = {sizeof heap};
    mc_range_t ranges[2] = {{0, "sa/zero-copy", 0, 100, 500}, {0, "sa/batch-1", 500, 7, 50}};
    int64_t range_results[2] = {0, 0};
    EXPECT_EQ(mc_store_get_into_ranges(store, buffers, buffer_sizes, 1, ranges, 2, range_results),
              0);
    EXPECT_EQ(range_results[0] == 500 && range_results[1] == 50, 1);
    EXPECT_EQ(memcmp(heap, pool + 100, 500), 0);
    EXPECT_EQ(memcmp(heap + 500, pool + VALUE + 7, 50), 0);

    /* Ordinary memory can be put and read (staged), but not registered. */
    fill(heap, VALUE, 9);
    EXPECT_EQ(mc_store_put_from(store, "sa/heap", heap, VALUE, NULL), 0);
    EXPECT_EQ(mc_store_get_into(store, "sa/heap", pool, VALUE), VALUE);
    EXPECT_EQ(memcmp(pool, heap, VALUE), 0);
    EXPECT_EQ(mc_store_register_buffer(store, heap, sizeof heap), -600);

    /* Exist / remove. */
    EXPECT_EQ(mc_store_is_exist(store, "sa/heap"), 1);
    EXPECT_EQ(mc_store_remove(store, "sa/heap", 1), 0);
    EXPECT_EQ(mc_store_is_exist(store, "sa/heap"), 0);

    EXPECT_EQ(mc_store_unregister_buffer(store, pool), 0);
    EXPECT_EQ(mc_shm_free(pool), 0);
    EXPECT_EQ(mc_shm_free(pool), -600);
}

int main(int argc, char **argv) {
    const char *master_bin = argc > 1 ? argv[1] : getenv("MOONCAKE_MASTER_BIN");
    const char *client_bin = argc > 2 ? argv[2] : getenv("MOONCAKE_CLIENT_BIN");
    if (master_bin == NULL || client_bin == NULL) {
        fprintf(stderr, "usage: %s <mooncake_master> <mooncake_client>\n", argv[0]);
        return 2;
    }
    int rpc_port = 0;
    pid_t master = start_master(master_bin, &rpc_port);
    EXPECT_EQ(master > 0, 1);
    char master_addr[64];
    snprintf(master_addr, sizeof master_addr, "127.0.0.1:%d", rpc_port);
    /* The real client: it owns the segment and serves dummies on @mooncake_client_<port>.sock,
     * <port> being its data port (the one in its segment name), as it runs with --port=0. */
    char real_name[256] = "";
    int real_out = -1;
    pid_t real = master > 0 ? start_peer(client_bin, master_addr, "64 MB", real_name,
                                         sizeof real_name, &real_out)
                            : -1;
    EXPECT_EQ(real > 0, 1);

    mc_store_t *store = mc_store_new();
    if (real > 0 && store != NULL) {
        int rc = mc_store_setup_dummy(store, 0, 16u << 20, real_name);
        EXPECT_EQ(rc, 0);
        if (rc == 0) worker(store);
    }
    mc_store_free(store);
    stop_child(real, SIGTERM, 10.0);
    if (real_out >= 0) close(real_out);
    stop_child(master, SIGTERM, 5.0);
    return example_exit_status("standalone");
}
