/* layerwise_on_stream.c: a layer-wise KV load overlapped with compute, on streams.
 *
 * The pattern of a pooled-KV forward pass (docs/c-api.md, "On-stream gets"): every layer's KV
 * is loaded from the store on a *load* stream while the *compute* stream works on the previous
 * layer; an event recorded after each load gates that layer's compute. Here both streams are
 * host streams (mc_host_stream_t), so it runs anywhere; with CUDA the same calls take
 * (MC_STREAM_CUDA, cudaStream_t) and cudaEventRecord / cudaStreamWaitEvent.
 *
 *   1. an embedded store; LAYERS objects of LAYER_BYTES deterministic bytes, one per layer;
 *   2. one get session over all layer keys (mc_store_batch_get_session_start): it pins the
 *      objects once, so the per-layer loads below make no master call at all;
 *   3. per layer: mc_store_get_into_ranges_on_stream on the load stream (returns at once with a
 *      ticket), mc_host_event_record on the load stream, mc_host_stream_wait_event on the compute
 *      stream, then mc_host_stream_launch of the layer's "compute" on the compute stream: it
 *      reads the ticket's status word, checks the layer's bytes and busy-waits about as long as
 *      the load took (load ~ compute, the regime where overlap pays);
 *   4. synchronize both streams, check every ticket (status 0, LAYER_BYTES read), every byte and
 *      that the layer loop made no master call; print the wall time against the serial time
 *      (sum of loads + computes) and the overlap ratio.
 *
 * Exit status 0 only if every check passed. Every wait is bounded (WAIT_MS). Timings are printed,
 * never checked.
 */
#define _POSIX_C_SOURCE 200809L
#include <mooncake_rs.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "example_check.h"

enum { LAYERS = 16 };
#define LAYER_BYTES ((size_t)1 << 20)
#define WAIT_MS 30000          /* bound of every wait on a stream, event or ticket */
#define MAX_COMPUTE_S 0.05     /* bound of one layer's modelled compute */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Byte `i` of layer `layer`'s KV: deterministic, different for every layer. */
static unsigned char kv_byte(size_t layer, size_t i) {
    return (unsigned char)((i * 131u) ^ (i >> 9) ^ (layer * 37u + 11u));
}

/* One layer: its destination buffer (the "HBM" copy of its KV) and what the streams record. */
struct layer {
    size_t index;
    char key[32];
    unsigned char *expected;    /* what was put (the pool's copy, kept to check against) */
    unsigned char *buf;
    mc_ticket_t *ticket;        /* the load's outcome */
    mc_host_event_t *loaded;    /* recorded on the load stream after the load */
    double load_start, load_end; /* stamped on the load stream around the load */
    double compute_s;           /* time the compute function ran */
    int32_t status_seen;        /* the ticket's status word as the compute read it */
    size_t mismatches;          /* wrong bytes the compute found */
};

static size_t count_mismatches(const struct layer *l) {
    if (memcmp(l->buf, l->expected, LAYER_BYTES) == 0) return 0;
    size_t bad = 0;
    for (size_t i = 0; i < LAYER_BYTES; i++) bad += l->buf[i] != l->expected[i];
    return bad;
}

/* Load stream: stamps the time (before and after a layer's load). */
static void stamp(void *arg) { *(double *)arg = now_s(); }

/* Compute stream: runs after the layer's load (the stream waited on l->loaded). */
static void compute(void *arg) {
    struct layer *l = arg;
    double start = now_s();
    /* The status word is final before any work enqueued after the call runs: a device kernel
     * would read it the same way to skip a failed layer. */
    const int32_t *word = mc_ticket_status_word(l->ticket);
    l->status_seen = word != NULL ? *(const volatile int32_t *)word : MC_ERR_INVALID_PARAMS;
    l->mismatches = count_mismatches(l);
    double load = l->load_end - l->load_start;
    if (load > MAX_COMPUTE_S) load = MAX_COMPUTE_S;
    while (now_s() - start < load) {
        /* busy: the layer's attention would run here */
    }
    l->compute_s = now_s() - start;
}

/* A number from the store's metrics JSON (the first `"name":`), or -1. */
static long long metric(mc_store_t *store, const char *name) {
    static char json[64 * 1024];
    char pattern[64];
    size_t needed = 0;
    if (mc_store_metrics_json(store, json, sizeof json, &needed) != MC_OK) return -1;
    snprintf(pattern, sizeof pattern, "\"%s\":", name);
    const char *at = strstr(json, pattern);
    return at != NULL ? strtoll(at + strlen(pattern), NULL, 10) : -1;
}

static int setup(mc_store_t *store) {
    mc_setup_config_t config;
    mc_setup_config_init(&config);
    config.master_server_addr = "embedded";
    config.global_segment_size = (uint64_t)LAYERS * LAYER_BYTES + (16u << 20);
    return mc_store_setup(store, &config);
}

/* Puts every layer's KV and starts one get session over all keys. */
static int put_and_open_session(mc_store_t *store, struct layer *layers, const char **keys) {
    int rc = MC_OK;
    for (size_t l = 0; l < LAYERS && rc == MC_OK; l++) {
        for (size_t i = 0; i < LAYER_BYTES; i++) layers[l].expected[i] = kv_byte(l, i);
        rc = mc_store_put_from(store, layers[l].key, layers[l].expected, LAYER_BYTES, NULL);
    }
    if (rc != MC_OK) return rc;
    int results[LAYERS];
    rc = mc_store_batch_get_session_start(store, keys, LAYERS, results);
    for (size_t l = 0; l < LAYERS && rc == MC_OK; l++) rc = results[l];
    return rc;
}

/* Enqueues layer l: load on `load` (stamped), event, compute on `compute` after the event. */
static int issue_layer(mc_store_t *store, struct layer *l, mc_host_stream_t *load,
                       mc_host_stream_t *compute_stream) {
    const char *key = l->key;
    void *dst = l->buf;
    void *const *bufs[1] = {&dst};
    size_t size = LAYER_BYTES;
    const size_t *sizes[1] = {&size};
    uint64_t offset = 0;
    const uint64_t *src_offsets[1] = {&offset};
    size_t buf_count = 1;
    int rc = mc_host_stream_launch(load, stamp, &l->load_start);
    if (rc == MC_OK)
        rc = mc_store_get_into_ranges_on_stream(store, &key, 1, bufs, sizes, src_offsets,
                                                &buf_count, MC_STREAM_HOST, load, &l->ticket);
    if (rc == MC_OK) rc = mc_host_stream_launch(load, stamp, &l->load_end);
    if (rc == MC_OK) rc = mc_host_event_record(l->loaded, load);
    if (rc == MC_OK) rc = mc_host_stream_wait_event(compute_stream, l->loaded);
    if (rc == MC_OK) rc = mc_host_stream_launch(compute_stream, compute, l);
    return rc;
}

/* After both streams are idle: every ticket final with status 0 and LAYER_BYTES read, every
 * byte right (checked by the compute and once more here). */
static void check_layers(const struct layer *layers) {
    for (size_t l = 0; l < LAYERS; l++) {
        const struct layer *x = &layers[l];
        if (x->ticket == NULL) continue; /* its issue failure was already counted */
        EXPECT_EQ(mc_ticket_wait(x->ticket, WAIT_MS), 0);
        EXPECT_EQ(mc_ticket_key_count(x->ticket), 1);
        int64_t read = 0;
        EXPECT_EQ(mc_ticket_results(x->ticket, &read, 1), 0);
        EXPECT_EQ(read, (int64_t)LAYER_BYTES);
        EXPECT_EQ(x->status_seen, 0);
        EXPECT_EQ(x->mismatches, 0);
        EXPECT_EQ(count_mismatches(x), 0);
    }
}

static void report(const struct layer *layers, double wall, long long master_calls) {
    double load = 0, busy = 0;
    for (size_t l = 0; l < LAYERS; l++) {
        load += layers[l].load_end - layers[l].load_start;
        busy += layers[l].compute_s;
    }
    double serial = load + busy;
    double hideable = load < busy ? load : busy;
    double overlap = hideable > 0 ? (serial - wall) / hideable : 0;
    if (overlap < 0) overlap = 0;
    if (overlap > 1) overlap = 1;
    printf("%d layers x %zu KiB, session ranges on a host load stream, compute on a host compute "
           "stream\n",
           LAYERS, LAYER_BYTES >> 10);
    printf("  load    (sum over layers): %8.3f ms\n", load * 1e3);
    printf("  compute (sum over layers): %8.3f ms\n", busy * 1e3);
    printf("  serial  (load + compute) : %8.3f ms\n", serial * 1e3);
    printf("  wall    (pipelined)      : %8.3f ms\n", wall * 1e3);
    printf("  overlap ratio            : %8.2f   ((serial - wall) / min(load, compute); 1 = the "
           "shorter side fully hidden)\n",
           overlap);
    printf("  master calls in the layer loop: %lld\n", master_calls);
}

int main(void) {
    static struct layer layers[LAYERS];
    const char *keys[LAYERS];
    mc_store_t *store = mc_store_new();
    mc_host_stream_t *load = mc_host_stream_new();
    mc_host_stream_t *compute_stream = mc_host_stream_new();
    int ready = store != NULL && load != NULL && compute_stream != NULL;
    for (size_t l = 0; l < LAYERS; l++) {
        layers[l].index = l;
        snprintf(layers[l].key, sizeof layers[l].key, "kv/layer.%02zu", l);
        keys[l] = layers[l].key;
        layers[l].expected = malloc(LAYER_BYTES);
        layers[l].buf = malloc(LAYER_BYTES);
        if (layers[l].buf != NULL) memset(layers[l].buf, 0, LAYER_BYTES); /* resident, like HBM */
        layers[l].loaded = mc_host_event_new();
        ready = ready && layers[l].expected != NULL && layers[l].buf != NULL &&
                layers[l].loaded != NULL;
    }
    EXPECT_EQ(ready, 1);
    if (ready) {
        EXPECT_EQ(setup(store), MC_OK);
        EXPECT_EQ(put_and_open_session(store, layers, keys), MC_OK);
    }
    if (example_failures == 0) {
        long long calls_before = metric(store, "master_calls");
        double start = now_s();
        for (size_t l = 0; l < LAYERS; l++)
            EXPECT_EQ(issue_layer(store, &layers[l], load, compute_stream), MC_OK);
        EXPECT_EQ(mc_host_stream_synchronize(load, WAIT_MS), 0);
        EXPECT_EQ(mc_host_stream_synchronize(compute_stream, WAIT_MS), 0);
        double wall = now_s() - start;
        check_layers(layers);
        long long calls = metric(store, "master_calls") - calls_before;
        EXPECT_EQ(calls, 0);
        EXPECT_EQ(metric(store, "tickets_outstanding"), 0);
        report(layers, wall, calls);
        EXPECT_EQ(mc_store_batch_get_session_end(store, keys, LAYERS), MC_OK);
    }
    /* Streams first (they finish what is enqueued), then what their work used. */
    mc_host_stream_free(compute_stream);
    mc_host_stream_free(load);
    for (size_t l = 0; l < LAYERS; l++) {
        mc_ticket_free(layers[l].ticket);
        mc_host_event_free(layers[l].loaded);
        free(layers[l].buf);
        free(layers[l].expected);
    }
    mc_store_free(store);
    return example_exit_status("layerwise_on_stream");
}
