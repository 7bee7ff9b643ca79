// layerwise_graph: the seed-000 pattern on a real GPU, through the C API only.
//
//   layerwise_graph [layers=32] [layer_mib=16] [replays=3]
//
// An embedded store holds one object per layer ("layer.<i>", `layer_mib` MiB each), read
// through get sessions. A CUDA graph is captured once on a *compute* stream: per layer i,
// `cudaStreamWaitEvent(compute, E_i, cudaEventWaitExternal)`, then a kernel that checksums
// layer i's device buffer into sums[i] (and then busy-waits a calibrated time, standing for
// the layer's attention, so loads and compute can overlap). Each replay: the host poisons the
// device buffers, issues `mc_store_get_into_ranges_on_stream` for every layer on a *side*
// stream (MC_STREAM_CUDA; two ranges per layer, "K" and "V" halves), records E_i on the side
// stream after each, launches the graph on the compute stream and synchronizes. Every
// checksum and every byte is checked, and every ticket must end with status 0.
//
// Also checked: an on-stream get issued on the compute stream while it is being captured
// (global capture mode) returns MC_ERR_STREAM_CAPTURE_UNSUPPORTED, hands back no ticket and
// leaves the capture usable.
//
// Printed: host µs per on-stream call, H2D GB/s of the loads alone, compute alone, the
// pipelined replay and the overlap = (T_load + T_compute - T_total) / min(T_load, T_compute)
// (1 = the shorter phase is fully hidden). Last line: "RESULT: PASS" or "RESULT: FAIL".
//
// Exit status: 0 every check passed; 1 a check failed; 3 the library has no CUDA stream
// backend (MC_ERR_NOT_SUPPORTED from the on-stream call).
//
// Built by scripts/gpu-check with nvcc against target/release/libmooncake_rs.so.
// The host-side preparation is done before the store is set up, so the timed part is short.

#include "gpu_check.cuh"

// sums[0] += Σ_j data[j] * (2j + 1) (mod 2^64, order-independent), then every block holds
// until *spin_ns nanoseconds have passed since it started (the layer's "compute").
__global__ void checksum_kernel(const uint32_t *__restrict__ data, size_t words,
                                unsigned long long *sum, const long long *spin_ns) {
    unsigned long long start = global_ns();
    unsigned long long acc = 0;
    size_t stride = size_t(gridDim.x) * blockDim.x;
    for (size_t j = size_t(blockIdx.x) * blockDim.x + threadIdx.x; j < words; j += stride)
        acc += (unsigned long long)data[j] * (2ull * j + 1);
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, off);
    if ((threadIdx.x & 31) == 0) atomicAdd(sum, acc);
    long long ns = *spin_ns;
    if (threadIdx.x == 0 && ns > 0)
        while (global_ns() - start < (unsigned long long)ns) {
        }
    __syncthreads();
}

// A kernel for the capture-refusal check.
__global__ void noop_kernel() {}

struct Layerwise {
    mc_store_t *store = nullptr;
    int layers = 0;
    size_t layer_bytes = 0;
    std::vector<std::string> keys;
    uint8_t *d_layers = nullptr;
    cudaStream_t side = nullptr, compute = nullptr;

    // One ranged get of layer i on `stream` (two ranges: the K and V halves).
    int get_layer(int i, cudaStream_t stream, mc_ticket_t **ticket) {
        const char *key = keys[i].c_str();
        size_t half = layer_bytes / 2;
        void *parts[2] = {d_layers + size_t(i) * layer_bytes,
                          d_layers + size_t(i) * layer_bytes + half};
        size_t sizes[2] = {half, layer_bytes - half};
        uint64_t offsets[2] = {0, half};
        void *const *bufs[1] = {parts};
        const size_t *size_lists[1] = {sizes};
        const uint64_t *offset_lists[1] = {offsets};
        size_t counts[1] = {2};
        return mc_store_get_into_ranges_on_stream(store, &key, 1, bufs, size_lists, offset_lists,
                                                  counts, MC_STREAM_CUDA, stream, ticket);
    }
};

int main(int argc, char **argv) {
    int layers = argc > 1 ? std::atoi(argv[1]) : 32;
    size_t layer_mib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 16;
    int replays = argc > 3 ? std::atoi(argv[3]) : 3;
    if (layers < 1 || layer_mib < 1 || replays < 3) {
        std::fprintf(stderr, "usage: layerwise_graph [layers>=1] [layer_mib>=1] [replays>=3]\n");
        return 2;
    }
    const size_t layer_bytes = layer_mib << 20;
    const size_t words = layer_bytes / 4;
    const size_t total = layer_bytes * size_t(layers);

    // Host data and expected checksums first (the store's clock starts at setup).
    std::vector<uint32_t> host(total / 4);
    std::vector<unsigned long long> expect(layers, 0);
    for (int i = 0; i < layers; i++) {
        uint32_t *w = host.data() + size_t(i) * words;
        unsigned long long s = 0;
        for (size_t j = 0; j < words; j++) {
            w[j] = word_of(uint32_t(i), j);
            s += (unsigned long long)w[j] * (2ull * j + 1);
        }
        expect[i] = s;
    }
    std::vector<uint8_t> readback(total);

    CK(cudaSetDevice(0));
    CK(cudaFree(nullptr)); // the primary context, current on this thread
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    int driver = 0, runtime = 0;
    CK(cudaDriverGetVersion(&driver));
    CK(cudaRuntimeGetVersion(&runtime));
    std::printf("device %s, %d SMs, driver %d, runtime %d; %d layers x %zu MiB, %d replays\n",
                prop.name, prop.multiProcessorCount, driver, runtime, layers, layer_mib, replays);

    Layerwise lw;
    lw.layers = layers;
    lw.layer_bytes = layer_bytes;
    CK(cudaMalloc(&lw.d_layers, total));
    unsigned long long *d_sums = nullptr;
    long long *d_spin = nullptr;
    CK(cudaMalloc(&d_sums, sizeof(unsigned long long) * layers));
    CK(cudaMalloc(&d_spin, sizeof(long long)));
    CK(cudaMemset(d_spin, 0, sizeof(long long)));
    CK(cudaStreamCreateWithFlags(&lw.side, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&lw.compute, cudaStreamNonBlocking));
    std::vector<cudaEvent_t> ready(layers);
    for (auto &e : ready) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    cudaEvent_t t_start, t_loaded, t_c0, t_c1, t_end;
    for (cudaEvent_t *e : {&t_start, &t_loaded, &t_c0, &t_c1, &t_end}) CK(cudaEventCreate(e));

    // The store: embedded master, a segment holding every layer (pinned by the library).
    mc_setup_config_t config;
    mc_setup_config_init(&config);
    config.local_hostname = "gpu-check-layerwise";
    config.master_server_addr = "embedded";
    config.global_segment_size = total + (64ull << 20);
    config.local_buffer_size = 16ull << 20;
    lw.store = mc_store_new();
    int rc = mc_store_setup(lw.store, &config);
    if (rc != 0) {
        std::fprintf(stderr, "mc_store_setup: %s\n", mc_error(rc).c_str());
        std::printf("RESULT: FAIL\n");
        return 1;
    }
    for (int i = 0; i < layers; i++) {
        lw.keys.push_back("layer." + std::to_string(i));
        rc = mc_store_put_from(lw.store, lw.keys[i].c_str(), host.data() + size_t(i) * words,
                               layer_bytes, nullptr);
        if (rc != 0) {
            std::fprintf(stderr, "put %s: %s\n", lw.keys[i].c_str(), mc_error(rc).c_str());
            std::printf("RESULT: FAIL\n");
            return 1;
        }
    }
    std::vector<const char *> key_ptrs;
    for (auto &k : lw.keys) key_ptrs.push_back(k.c_str());
    std::vector<int> started(layers, 0);
    rc = mc_store_batch_get_session_start(lw.store, key_ptrs.data(), layers, started.data());
    bool sessions_ok = rc == 0 && std::all_of(started.begin(), started.end(), [](int r) { return r == 0; });
    check(sessions_ok, "get sessions started", sessions_ok ? "" : mc_error(rc));
    if (!sessions_ok) {
        std::printf("RESULT: FAIL\n");
        return 1;
    }

    std::vector<mc_ticket_t *> tickets(layers, nullptr);
    std::vector<double> call_us;

    // 1. Loads alone (side stream): calibrates the compute and gives the H2D rate.
    CK(cudaMemsetAsync(lw.d_layers, 0xEE, total, lw.side));
    CK(cudaEventRecord(t_start, lw.side));
    for (int i = 0; i < layers; i++) {
        double t = now_us();
        rc = lw.get_layer(i, lw.side, &tickets[i]);
        call_us.push_back(now_us() - t);
        if (rc == MC_ERR_NOT_SUPPORTED) {
            std::printf("CHECK %-44s NOT SUPPORTED  %s\n", "on-stream get on a CUDA stream",
                        mc_error(rc).c_str());
            std::printf("RESULT: NOT SUPPORTED (the library has no CUDA stream backend)\n");
            return 3;
        }
        if (rc != 0) {
            check(false, "on-stream get on a CUDA stream", mc_error(rc));
            if (rc == MC_ERR_TRY_AGAIN)
                std::printf("hint: staging exhausted; resident layers should need none (is the "
                            "segment pinned? see staged_copies)\n");
            print_stream_metrics(lw.store);
            std::printf("RESULT: FAIL\n");
            return 1;
        }
    }
    CK(cudaEventRecord(t_loaded, lw.side));
    CK(cudaStreamSynchronize(lw.side));
    int bad = settle(tickets, layer_bytes, "loads alone");
    check(bad == 0, "loads alone: every ticket 0, full bytes", std::to_string(bad) + " bad");
    float load_ms = 0;
    CK(cudaEventElapsedTime(&load_ms, t_start, t_loaded));
    CK(cudaMemcpy(readback.data(), lw.d_layers, total, cudaMemcpyDeviceToHost));
    bool bytes_ok = std::memcmp(readback.data(), host.data(), total) == 0;
    check(bytes_ok, "loads alone: device bytes equal the objects");
    double issue_total_us = 0;
    for (double u : call_us) issue_total_us += u;
    check(issue_total_us < load_ms * 1000.0,
          "calls return before their copies finish",
          "issue " + std::to_string(issue_total_us / 1000.0) + " ms vs loads " +
              std::to_string(load_ms) + " ms");

    // The compute per layer ≈ one layer's load.
    long long spin_ns = (long long)(double(load_ms) * 1e6 / layers);
    CK(cudaMemcpy(d_spin, &spin_ns, sizeof spin_ns, cudaMemcpyHostToDevice));

    // 2. Capture: the refused call first, then the per-layer wait + checksum nodes.
    const int threads = 256;
    const int blocks = prop.multiProcessorCount * 2;
    CK(cudaStreamBeginCapture(lw.compute, cudaStreamCaptureModeGlobal));
    mc_ticket_t *refused = nullptr;
    int refused_rc = lw.get_layer(0, lw.compute, &refused);
    std::string refused_msg = mc_error(refused_rc);
    mc_ticket_t *refused_batch = nullptr;
    {
        void *buf = lw.d_layers;
        size_t size = layer_bytes;
        const char *key = lw.keys[0].c_str();
        int rc2 = mc_store_batch_get_into_on_stream(lw.store, &key, &buf, &size, 1, MC_STREAM_CUDA,
                                                    lw.compute, &refused_batch);
        check(rc2 == MC_ERR_STREAM_CAPTURE_UNSUPPORTED && refused_batch == nullptr,
              "batch on-stream get while capturing: -9002", mc_error(rc2));
    }
    for (int i = 0; i < layers; i++) {
        CK(cudaStreamWaitEvent(lw.compute, ready[i], cudaEventWaitExternal));
        checksum_kernel<<<blocks, threads, 0, lw.compute>>>(
            reinterpret_cast<const uint32_t *>(lw.d_layers + size_t(i) * layer_bytes), words,
            d_sums + i, d_spin);
        CK(cudaGetLastError());
    }
    cudaGraph_t graph = nullptr;
    cudaError_t end_rc = cudaStreamEndCapture(lw.compute, &graph);
    check(refused_rc == MC_ERR_STREAM_CAPTURE_UNSUPPORTED && refused == nullptr,
          "ranges on-stream get while capturing: -9002", refused_msg);
    check(end_rc == cudaSuccess, "capture still valid after the refused calls",
          end_rc == cudaSuccess ? "" : cudaGetErrorString(end_rc));
    if (end_rc != cudaSuccess) {
        std::printf("RESULT: FAIL\n");
        return 1;
    }
    cudaGraphExec_t exec = nullptr;
    CK(cudaGraphInstantiateWithFlags(&exec, graph, 0));
    size_t nodes = 0;
    CK(cudaGraphGetNodes(graph, nullptr, &nodes));
    std::printf("graph: %zu nodes (%d event waits + %d kernels)\n", nodes, layers, layers);

    // 3. Compute alone: the events are recorded with nothing before them.
    for (int i = 0; i < layers; i++) CK(cudaEventRecord(ready[i], lw.side));
    CK(cudaStreamSynchronize(lw.side));
    CK(cudaMemsetAsync(d_sums, 0, sizeof(unsigned long long) * layers, lw.compute));
    CK(cudaEventRecord(t_c0, lw.compute));
    CK(cudaGraphLaunch(exec, lw.compute));
    CK(cudaEventRecord(t_c1, lw.compute));
    CK(cudaStreamSynchronize(lw.compute));
    float compute_ms = 0;
    CK(cudaEventElapsedTime(&compute_ms, t_c0, t_c1));

    // 4. Replays: loads on the side stream feeding the graph on the compute stream.
    std::vector<double> total_ms, replay_call_us;
    std::vector<unsigned long long> sums(layers);
    for (int r = 0; r < replays; r++) {
        CK(cudaMemsetAsync(lw.d_layers, 0xEE, total, lw.side));
        CK(cudaMemsetAsync(d_sums, 0, sizeof(unsigned long long) * layers, lw.compute));
        CK(cudaStreamSynchronize(lw.side));
        CK(cudaStreamSynchronize(lw.compute));
        CK(cudaEventRecord(t_start, lw.side));
        bool issued = true;
        for (int i = 0; i < layers && issued; i++) {
            double t = now_us();
            rc = lw.get_layer(i, lw.side, &tickets[i]);
            replay_call_us.push_back(now_us() - t);
            if (rc != 0) {
                check(false, "replay on-stream get", mc_error(rc));
                issued = false;
                // Open every later wait so the graph cannot hang on an unrecorded event.
                for (int k = i; k < layers; k++) CK(cudaEventRecord(ready[k], lw.side));
                break;
            }
            CK(cudaEventRecord(ready[i], lw.side));
        }
        CK(cudaGraphLaunch(exec, lw.compute));
        CK(cudaEventRecord(t_end, lw.compute));
        CK(cudaStreamSynchronize(lw.compute));
        CK(cudaStreamSynchronize(lw.side));
        bad = settle(tickets, layer_bytes, "replay");
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, t_start, t_end));
        total_ms.push_back(ms);
        CK(cudaMemcpy(sums.data(), d_sums, sizeof(unsigned long long) * layers,
                      cudaMemcpyDeviceToHost));
        int wrong_sums = 0;
        for (int i = 0; i < layers; i++) wrong_sums += sums[i] != expect[i];
        CK(cudaMemcpy(readback.data(), lw.d_layers, total, cudaMemcpyDeviceToHost));
        int wrong_layers = 0;
        for (int i = 0; i < layers; i++)
            wrong_layers += std::memcmp(readback.data() + size_t(i) * layer_bytes,
                                        host.data() + size_t(i) * words, layer_bytes) != 0;
        char name[64];
        std::snprintf(name, sizeof name, "replay %d: tickets, checksums, bytes", r);
        check(issued && bad == 0 && wrong_sums == 0 && wrong_layers == 0, name,
              std::to_string(bad) + " bad tickets, " + std::to_string(wrong_sums) +
                  " wrong checksums, " + std::to_string(wrong_layers) + " wrong layers, " +
                  std::to_string(ms) + " ms");
    }

    double t_total = median(total_ms);
    double overlap =
        (double(load_ms) + double(compute_ms) - t_total) / std::min<double>(load_ms, compute_ms);
    std::printf("host call per layer: median %.1f us, max %.1f us (%zu calls)\n",
                median(replay_call_us),
                *std::max_element(replay_call_us.begin(), replay_call_us.end()),
                replay_call_us.size());
    std::printf("loads alone: %.3f ms, H2D %.2f GB/s; compute alone: %.3f ms (spin %lld ns/layer)\n",
                load_ms, double(total) / (load_ms * 1e-3) / 1e9, compute_ms, spin_ns);
    std::printf("pipelined replay: median %.3f ms (serial would be %.3f ms); overlap %.2f\n",
                t_total, double(load_ms) + double(compute_ms), overlap);
    std::printf("SUMMARY call_us=%.1f h2d_gbps=%.2f load_ms=%.3f compute_ms=%.3f total_ms=%.3f "
                "overlap=%.2f\n",
                median(replay_call_us), double(total) / (load_ms * 1e-3) / 1e9, load_ms,
                compute_ms, t_total, overlap);

    print_stream_metrics(lw.store);

    mc_store_batch_get_session_end(lw.store, key_ptrs.data(), layers);
    mc_store_free(lw.store);
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    for (auto &e : ready) CK(cudaEventDestroy(e));
    for (cudaEvent_t e : {t_start, t_loaded, t_c0, t_c1, t_end}) CK(cudaEventDestroy(e));
    CK(cudaStreamDestroy(lw.side));
    CK(cudaStreamDestroy(lw.compute));
    CK(cudaFree(lw.d_layers));
    CK(cudaFree(d_sums));
    CK(cudaFree(d_spin));
    std::printf("RESULT: %s\n", g_failures == 0 ? "PASS" : "FAIL");
    return g_failures == 0 ? 0 : 1;
}
