// Shared by the gpu-check CUDA programs (layerwise_graph.cu, producer.cu): error checks,
// the CHECK/RESULT output format, timing helpers, the layer data pattern, stream metrics and
// ticket settling. Header-only; each program is one translation unit.
#pragma once

#include <cuda_runtime.h>
#include <mooncake_rs.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CK(call)                                                                         \
    do {                                                                                 \
        cudaError_t err_ = (call);                                                       \
        if (err_ != cudaSuccess) {                                                       \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,           \
                         cudaGetErrorString(err_));                                      \
            std::printf("RESULT: FAIL\n");                                               \
            std::exit(1);                                                                \
        }                                                                                \
    } while (0)

static int g_failures = 0;

static void check(bool ok, const char *name, const std::string &detail = "") {
    std::printf("CHECK %-44s %s%s%s\n", name, ok ? "PASS" : "FAIL", detail.empty() ? "" : "  ",
                detail.c_str());
    if (!ok) g_failures++;
}

static std::string mc_error(int64_t code) {
    char msg[512];
    mc_last_error_message(msg, sizeof msg);
    return std::to_string(code) + " " + mc_strerror(code) + ": " + msg;
}

static double now_us() {
    using namespace std::chrono;
    return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

static double median(std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// The 32-bit word j of layer i (what the store holds).
static inline uint32_t word_of(uint32_t layer, uint64_t j) {
    uint64_t x = (j + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t(layer) << 40) ^ (layer * 0x85EBCA6Bu);
    x ^= x >> 29;
    return uint32_t(x) ^ uint32_t(x >> 32);
}

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Prints the store's "stream" counters (direct vs staged copies, tickets, pins).
static void print_stream_metrics(mc_store_t *store) {
    size_t needed = 0;
    mc_store_metrics_json(store, nullptr, 0, &needed);
    std::string json(needed, '\0');
    if (needed && mc_store_metrics_json(store, json.data(), needed, &needed) == 0) {
        size_t at = json.find("\"stream\"");
        if (at != std::string::npos)
            std::printf("metrics %s\n", json.substr(at, json.find('}', at) - at + 1).c_str());
    }
}

// Waits for every ticket; returns how many did not end with status 0 and exactly the layer's
// bytes, and frees them.
static int settle(std::vector<mc_ticket_t *> &tickets, size_t layer_bytes, const char *what) {
    int bad = 0;
    for (size_t i = 0; i < tickets.size(); i++) {
        if (!tickets[i]) continue;
        int status = mc_ticket_wait(tickets[i], 30000);
        int64_t bytes = -1;
        if (mc_ticket_results(tickets[i], &bytes, 1) != 0) bytes = -1;
        if (status != 0 || bytes != int64_t(layer_bytes)) {
            if (bad++ < 3)
                std::fprintf(stderr, "%s: layer %zu ticket status %d (%s), bytes %lld\n", what, i,
                             status, mc_strerror(status), (long long)bytes);
        }
        mc_ticket_free(tickets[i]);
        tickets[i] = nullptr;
    }
    return bad;
}

