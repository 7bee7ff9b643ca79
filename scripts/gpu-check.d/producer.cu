// producer: the save half of seed 000 on a real GPU (issue 7), through the C API only.
//
//   producer [layers=32] [layer_mib=16]
//
// One compute stream. Per layer i a kernel writes layer i's bytes into a device buffer and
// then busy-waits (the layer's compute, about twice the layer's device-to-host copy); right
// after it, on the *same* stream, `mc_store_batch_put_from_on_stream` saves the buffer as
// "save.<i>" (MC_STREAM_CUDA). The host never waits for the compute: each put call only
// reserves and enqueues. Checked: every put ticket ends with status 0 (committed); every
// object is then loaded back with `mc_store_batch_get_into_on_stream` on a second stream
// into fresh device buffers and every byte compared with the host's expectation; a put on a
// capturing stream is refused with MC_ERR_STREAM_CAPTURE_UNSUPPORTED.
//
// Printed: host µs per put call, compute alone, compute + save (to the last commit), their
// ratio (target <= 1.05 when the save copy is shorter than the compute) and the load-back
// rate. Last line: "RESULT: PASS" or "RESULT: FAIL".
//
// Exit status: 0 every check passed; 1 a check failed; 3 the library has no CUDA stream
// backend (MC_ERR_NOT_SUPPORTED). Built by scripts/gpu-check with nvcc against
// target/release/libmooncake_rs.so.

#include "gpu_check.cuh"

// Writes layer `layer`'s words into `dst`, then holds every block until `spin_ns` passed.
__global__ void produce_kernel(uint32_t *__restrict__ dst, size_t words, uint32_t layer,
                               long long spin_ns) {
    unsigned long long start = global_ns();
    size_t stride = size_t(gridDim.x) * blockDim.x;
    for (size_t j = size_t(blockIdx.x) * blockDim.x + threadIdx.x; j < words; j += stride) {
        uint64_t x = (j + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t(layer) << 40) ^
                     (layer * 0x85EBCA6Bu);
        x ^= x >> 29;
        dst[j] = uint32_t(x) ^ uint32_t(x >> 32);
    }
    if (threadIdx.x == 0 && spin_ns > 0)
        while (global_ns() - start < (unsigned long long)spin_ns) {
        }
    __syncthreads();
}

int main(int argc, char **argv) {
    int layers = argc > 1 ? std::atoi(argv[1]) : 32;
    size_t layer_mib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 16;
    if (layers < 1 || layer_mib < 1) {
        std::fprintf(stderr, "usage: producer [layers>=1] [layer_mib>=1]\n");
        return 2;
    }
    const size_t layer_bytes = layer_mib << 20;
    const size_t words = layer_bytes / 4;
    const size_t total = layer_bytes * size_t(layers);

    CK(cudaSetDevice(0));
    CK(cudaFree(nullptr));
    uint8_t *d_src = nullptr, *d_back = nullptr;
    CK(cudaMalloc(&d_src, total));
    CK(cudaMalloc(&d_back, total));
    cudaStream_t compute = nullptr, load = nullptr;
    CK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&load, cudaStreamNonBlocking));

    mc_setup_config_t config;
    mc_setup_config_init(&config);
    config.local_hostname = "gpu-check-producer";
    config.master_server_addr = "embedded";
    config.global_segment_size = total + (64ull << 20);
    config.local_buffer_size = 16ull << 20;
    mc_store_t *store = mc_store_new();
    int rc = mc_store_setup(store, &config);
    if (rc != 0) {
        std::fprintf(stderr, "mc_store_setup: %s\n", mc_error(rc).c_str());
        std::printf("RESULT: FAIL\n");
        return 1;
    }
    std::vector<std::string> keys;
    for (int i = 0; i < layers; i++) keys.push_back("save." + std::to_string(i));

    // The compute's length: about twice one layer's device-to-host copy.
    CK(cudaMemset(d_src, 0, layer_bytes));
    void *h_probe = nullptr;
    CK(cudaMallocHost(&h_probe, layer_bytes));
    double t0 = now_us();
    CK(cudaMemcpy(h_probe, d_src, layer_bytes, cudaMemcpyDeviceToHost));
    double d2h_us = now_us() - t0;
    CK(cudaFreeHost(h_probe));
    long long spin_ns = (long long)(2.0 * d2h_us * 1000.0);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const int threads = 256, blocks = 4 * prop.multiProcessorCount;

    // 1. Compute alone.
    t0 = now_us();
    for (int i = 0; i < layers; i++)
        produce_kernel<<<blocks, threads, 0, compute>>>(
            reinterpret_cast<uint32_t *>(d_src + size_t(i) * layer_bytes), words, uint32_t(i),
            spin_ns);
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(compute));
    double compute_us = now_us() - t0;

    // 2. Compute + save on the same stream; done when the last put is committed.
    std::vector<mc_ticket_t *> tickets(layers, nullptr);
    std::vector<double> call_us;
    bool not_supported = false;
    t0 = now_us();
    for (int i = 0; i < layers && !not_supported; i++) {
        produce_kernel<<<blocks, threads, 0, compute>>>(
            reinterpret_cast<uint32_t *>(d_src + size_t(i) * layer_bytes), words, uint32_t(i),
            spin_ns);
        const char *key = keys[i].c_str();
        const void *src = d_src + size_t(i) * layer_bytes;
        double c0 = now_us();
        rc = mc_store_batch_put_from_on_stream(store, &key, &src, &layer_bytes, 1, nullptr,
                                               MC_STREAM_CUDA, compute, &tickets[i]);
        call_us.push_back(now_us() - c0);
        if (rc == MC_ERR_NOT_SUPPORTED) not_supported = true;
        check(rc == 0 || not_supported, "put issued", rc == 0 ? "" : mc_error(rc));
    }
    if (not_supported) {
        std::printf("RESULT: NOT SUPPORTED (no CUDA stream backend)\n");
        return 3;
    }
    int bad = settle(tickets, layer_bytes, "compute + save");
    double both_us = now_us() - t0;
    CK(cudaStreamSynchronize(compute));
    check(bad == 0, "every put committed", std::to_string(bad) + " bad");

    // 3. Load everything back on a second stream and compare every byte.
    CK(cudaMemset(d_back, 0xEE, total));
    std::vector<const char *> key_ptrs;
    std::vector<void *> dsts;
    std::vector<size_t> sizes(layers, layer_bytes);
    for (int i = 0; i < layers; i++) {
        key_ptrs.push_back(keys[i].c_str());
        dsts.push_back(d_back + size_t(i) * layer_bytes);
    }
    mc_ticket_t *back = nullptr;
    t0 = now_us();
    rc = mc_store_batch_get_into_on_stream(store, key_ptrs.data(), dsts.data(), sizes.data(),
                                           layers, MC_STREAM_CUDA, load, &back);
    check(rc == 0, "load back issued", rc == 0 ? "" : mc_error(rc));
    CK(cudaStreamSynchronize(load));
    double load_us = now_us() - t0;
    check(back && mc_ticket_wait(back, 30000) == 0, "load back ticket 0");
    mc_ticket_free(back);
    std::vector<uint32_t> host(total / 4);
    CK(cudaMemcpy(host.data(), d_back, total, cudaMemcpyDeviceToHost));
    size_t wrong = 0;
    for (int i = 0; i < layers; i++)
        for (size_t j = 0; j < words; j++)
            wrong += host[size_t(i) * words + j] != word_of(uint32_t(i), j);
    check(wrong == 0, "every saved byte read back", std::to_string(wrong) + " wrong words");

    // 4. A put on a capturing stream is refused and leaves the capture usable.
    cudaGraph_t graph = nullptr;
    CK(cudaStreamBeginCapture(compute, cudaStreamCaptureModeGlobal));
    const char *key = "captured";
    const void *src = d_src;
    mc_ticket_t *captured = nullptr;
    rc = mc_store_batch_put_from_on_stream(store, &key, &src, &layer_bytes, 1, nullptr,
                                           MC_STREAM_CUDA, compute, &captured);
    CK(cudaStreamEndCapture(compute, &graph));
    check(rc == MC_ERR_STREAM_CAPTURE_UNSUPPORTED && captured == nullptr,
          "put on a capturing stream refused", mc_error(rc));
    if (graph) CK(cudaGraphDestroy(graph));

    print_stream_metrics(store);
    double ratio = both_us / compute_us;
    double gbs = double(total) / (load_us * 1e3);
    std::printf("SUMMARY put call %.1f us/layer, compute %.1f ms, compute+save %.1f ms "
                "(ratio %.3f, target <= 1.05), load back %.2f GB/s\n",
                median(call_us), compute_us / 1e3, both_us / 1e3, ratio, gbs);
    mc_store_free(store);
    CK(cudaFree(d_src));
    CK(cudaFree(d_back));
    std::printf("RESULT: %s\n", g_failures == 0 ? "PASS" : "FAIL");
    return g_failures == 0 ? 0 : 1;
}
