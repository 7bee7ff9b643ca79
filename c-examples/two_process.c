/* two_process.c: two clients over TCP (or RDMA) against a real mooncake_master.
 *
 *   two_process <path/to/mooncake_master> <path/to/mooncake_client> [rdma <device> <data address>]
 *   (or MOONCAKE_MASTER_BIN / MOONCAKE_CLIENT_BIN in the environment)
 *
 * With `rdma <device> <address>` both clients use protocol "rdma" on that device and address
 * (scripts/rdma-ctest.sh runs it so inside the soft-RoCE VM), and the store's metrics must show
 * the bytes moved by RDMA and none over TCP.
 *
 * Starts the master on a free 127.0.0.1 port, starts a `mooncake_client` peer process that
 * contributes a segment (it prints "READY <segment name>"), then opens an in-process store with its
 * own segment. Puts one object with preferred segment = the peer and one with preferred segment =
 * itself, reads both back over the transport, then stops the peer gracefully: the peer unmounts its
 * segment, so its object disappears cluster-wide while the local one stays readable. Every wait is
 * bounded; the children are killed and reaped on every path.
 */
#define _POSIX_C_SOURCE 200809L
#include <mooncake_rs.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "example_check.h"
#include "example_proc.h"

enum { OBJECT_SIZE = 1 << 20 };

static void fill(unsigned char *buf, size_t len, unsigned seed) {
    for (size_t i = 0; i < len; i++) buf[i] = (unsigned char)((i * 131u) ^ seed);
}

/* Over RDMA: the metrics count RDMA bytes and no TCP data bytes. */
static void expect_rdma_route(mc_store_t *store) {
    static char json[1 << 16];
    size_t needed = 0;
    EXPECT_EQ(mc_store_metrics_json(store, json, sizeof json, &needed), 0);
    EXPECT_EQ(strstr(json, "\"tcp_read_bytes\":0,") != NULL, 1);
    EXPECT_EQ(strstr(json, "\"tcp_write_bytes\":0,") != NULL, 1);
    EXPECT_EQ(strstr(json, "\"rdma_read_bytes\":0,") == NULL, 1);
    EXPECT_EQ(strstr(json, "\"rdma_write_bytes\":0,") == NULL, 1);
}

/* The in-process half: puts on the peer and on itself, reads back, stops the peer, checks. */
static void scenario(mc_store_t *store, const char *peer_name, pid_t *peer, int rdma) {
    static unsigned char remote_value[OBJECT_SIZE], local_value[OBJECT_SIZE], out[OBJECT_SIZE];
    fill(remote_value, sizeof remote_value, 0x5a);
    fill(local_value, sizeof local_value, 0xa5);
    char self_name[256];
    EXPECT_EQ(mc_store_get_hostname(store, self_name, sizeof self_name), 0);

    mc_replicate_config_t on_peer, on_self;
    mc_replicate_config_init(&on_peer);
    mc_replicate_config_init(&on_self);
    const char *peer_segments[1] = {peer_name};
    const char *self_segments[1] = {self_name};
    on_peer.preferred_segments = peer_segments;
    on_peer.preferred_segments_count = 1;
    on_self.preferred_segments = self_segments;
    on_self.preferred_segments_count = 1;

    EXPECT_EQ(mc_store_put_from(store, "two/remote", remote_value, OBJECT_SIZE, &on_peer), 0);
    EXPECT_EQ(mc_store_put_from(store, "two/local", local_value, OBJECT_SIZE, &on_self), 0);
    EXPECT_EQ(mc_store_get_into(store, "two/remote", out, sizeof out), OBJECT_SIZE);
    EXPECT_EQ(memcmp(out, remote_value, OBJECT_SIZE), 0);
    EXPECT_EQ(mc_store_get_into(store, "two/local", out, sizeof out), OBJECT_SIZE);
    EXPECT_EQ(memcmp(out, local_value, OBJECT_SIZE), 0);
    if (rdma) expect_rdma_route(store);

    /* SIGTERM: the peer tears down and unmounts its segment; its object goes with it. */
    int status = stop_child(*peer, SIGTERM, 10.0);
    *peer = -1;
    EXPECT_EQ(WIFEXITED(status) && WEXITSTATUS(status) == 0, 1);
    EXPECT_EQ(mc_store_get_into(store, "two/remote", out, sizeof out) < 0, 1);
    memset(out, 0, sizeof out);
    EXPECT_EQ(mc_store_get_into(store, "two/local", out, sizeof out), OBJECT_SIZE);
    EXPECT_EQ(memcmp(out, local_value, OBJECT_SIZE), 0);
}

int main(int argc, char **argv) {
    const char *master_bin = argc > 1 ? argv[1] : getenv("MOONCAKE_MASTER_BIN");
    const char *client_bin = argc > 2 ? argv[2] : getenv("MOONCAKE_CLIENT_BIN");
    if (master_bin == NULL || client_bin == NULL) {
        fprintf(stderr, "usage: %s <mooncake_master> <mooncake_client>\n", argv[0]);
        return 2;
    }
    int rdma = argc > 5 && strcmp(argv[3], "rdma") == 0;
    const char *protocol = rdma ? "rdma" : "tcp";
    const char *device = rdma ? argv[4] : "";
    const char *host = rdma ? argv[5] : "127.0.0.1";
    int rpc_port = 0;
    pid_t master = start_master(master_bin, &rpc_port);
    EXPECT_EQ(master > 0, 1);
    char master_addr[64];
    snprintf(master_addr, sizeof master_addr, "127.0.0.1:%d", rpc_port);
    char peer_name[256] = "";
    int peer_out = -1;
    pid_t peer = master > 0 ? start_peer_on(client_bin, master_addr, "64 MB", host, protocol,
                                            device, peer_name, sizeof peer_name, &peer_out)
                            : -1;
    EXPECT_EQ(peer > 0, 1);

    mc_store_t *store = mc_store_new();
    if (peer > 0 && store != NULL) {
        mc_setup_config_t config;
        mc_setup_config_init(&config);
        config.local_hostname = host;
        config.protocol = protocol;
        config.device_name = device;
        config.metadata_server = "P2PHANDSHAKE";
        config.global_segment_size = 16u << 20;
        config.local_buffer_size = 16u << 20;
        config.master_server_addr = master_addr;
        int rc = mc_store_setup(store, &config);
        EXPECT_EQ(rc, 0);
        if (rc == 0) scenario(store, peer_name, &peer, rdma);
    }
    mc_store_free(store);
    stop_child(peer, SIGKILL, 5.0);
    if (peer_out >= 0) close(peer_out);
    stop_child(master, SIGTERM, 5.0);
    return example_exit_status("two_process");
}
