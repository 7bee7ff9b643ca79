// A random, seeded fuzzer of the C surface, meant to run under ASan (the asan preset): eight
// threads drive mc_store_* calls on one embedded store with NULL keys, buffers and arrays,
// empty, over-long and non-UTF-8 keys, misaligned and overlapping buffers (always inside
// memory the test owns: the API cannot check a length it is not told), huge counts behind
// NULL arrays, overlapping registrations, and calls after teardown. Every call must return
// (no crash, no ASan report) with a code in its documented range, and afterwards the store
// must still store and return exact bytes. The seed is printed (MC_CAPI_FUZZ_SEED overrides).
#include "support.hpp"

#include <algorithm>
#include <cstdio>
#include <random>
#include <thread>

namespace {

constexpr size_t kArena = 64 * 1024;
constexpr size_t kMaxSpan = 8192;

struct Fuzzer {
    mc_store_t *store;
    std::mt19937_64 rng;
    std::vector<unsigned char> arena = std::vector<unsigned char>(kArena + kMaxSpan + 64);
    std::vector<void *> registered;
    std::string long_key = std::string(4096, 'k');
    std::string keys[8];

    Fuzzer(mc_store_t *s, uint64_t seed) : store(s), rng(seed) {
        for (int i = 0; i < 8; ++i) keys[i] = "fuzz/" + std::to_string(i);
    }

    uint64_t below(uint64_t n) { return n == 0 ? 0 : rng() % n; }

    const char *key() {
        switch (below(10)) {
            case 0: return nullptr;
            case 1: return "";
            case 2: return long_key.c_str();
            case 3: return "\xff\xfe bad utf-8";
            default: return keys[below(8)].c_str();
        }
    }

    /** A span inside the arena (misaligned at random), or NULL with a random size. */
    void *span(size_t *size) {
        static const size_t sizes[] = {0, 1, 7, 64, 4096, kMaxSpan};
        *size = below(3) == 0 ? sizes[below(6)] : below(kMaxSpan + 1);
        if (below(12) == 0) return nullptr;
        return arena.data() + below(kArena);
    }

    size_t huge() {
        static const size_t counts[] = {SIZE_MAX, SIZE_MAX / 2, size_t(1) << 40, size_t(1) << 31};
        return counts[below(4)];
    }

    /** One random call; returns false when its return code is outside the documented range. */
    bool step() {
        size_t n = 0;
        void *p = nullptr;
        const size_t count = 1 + below(4);
        const char *ks[4];
        void *bufs[4];
        size_t sizes[4];
        int results[4];
        int64_t results64[4];
        for (size_t i = 0; i < count; ++i) {
            ks[i] = key();
            bufs[i] = span(&sizes[i]);
        }
        if (below(4) == 0 && count > 1) bufs[1] = bufs[0];  // overlapping buffers
        switch (below(17)) {
            case 0: p = span(&n); return mc_store_put(store, key(), p, n, nullptr) <= 0;
            case 1: p = span(&n); return mc_store_upsert(store, key(), p, n, nullptr) <= 0;
            case 2: p = span(&n); return mc_store_put_from(store, key(), p, n, nullptr) <= 0;
            case 3: p = span(&n); return mc_store_get_into(store, key(), p, n) >= -100000;
            case 4: return mc_store_get_size(store, key()) >= -100000;
            case 5: { int rc = mc_store_is_exist(store, key()); return rc <= 1; }
            case 6: return mc_store_remove(store, key(), int(below(2))) <= 0;
            case 7:
                if (below(3) == 0) return mc_store_batch_is_exist(store, nullptr, huge(), nullptr) < 0;
                return mc_store_batch_is_exist(store, ks, count, results) <= 0;
            case 8:
                if (below(3) == 0) return mc_store_batch_remove(store, nullptr, huge(), 0, nullptr) < 0;
                return mc_store_batch_remove(store, ks, count, 0, results) <= 0;
            case 9:
                if (below(3) == 0)
                    return mc_store_batch_get_into(store, nullptr, nullptr, nullptr, huge(), nullptr) < 0;
                return mc_store_batch_get_into(store, ks, bufs, sizes, count, results64) <= 0;
            case 10:
                if (below(3) == 0)
                    return mc_store_put_batch(store, nullptr, nullptr, nullptr, huge(), nullptr) < 0;
                return mc_store_put_batch(store, ks, bufs, sizes, count, nullptr) <= 0;
            case 11:
                return mc_store_batch_put_from(store, ks, bufs, sizes, count, nullptr, results) <= 0;
            case 12: {
                static const char *patterns[] = {"fuzz/[0-3]", "(", nullptr, "", ".*x"};
                return mc_store_remove_by_regex(store, patterns[below(5)], 0) >= -100000;
            }
            case 13: {
                p = span(&n);
                int rc = mc_store_register_buffer(store, p, n);
                if (rc == 0) registered.push_back(p);
                return rc <= 0;
            }
            case 14: {
                if (registered.empty() || below(4) == 0) {
                    // A random pointer may be the start of one of ours: then it is unregistered.
                    void *q = span(&n);
                    int rc = mc_store_unregister_buffer(store, q);
                    auto ours = std::find(registered.begin(), registered.end(), q);
                    if (ours == registered.end()) return rc <= 0;
                    registered.erase(ours);
                    return rc == 0;
                }
                size_t at = below(registered.size());
                int rc = mc_store_unregister_buffer(store, registered[at]);
                registered.erase(registered.begin() + long(at));
                return rc == 0;
            }
            case 15: {
                mc_buffer_t *out = nullptr;
                int rc = mc_store_get_buffer(store, key(), below(8) == 0 ? nullptr : &out);
                if (out != nullptr) mc_buffer_free(out);
                return rc <= 0;
            }
            default:
                return mc_store_get_into_ranges(store, nullptr, nullptr, below(2) ? huge() : 0, nullptr,
                                                below(2) ? huge() : 1, nullptr) < 0;
        }
    }
};

uint64_t seed_from_env() {
    const char *text = std::getenv("MC_CAPI_FUZZ_SEED");
    if (text != nullptr) return std::strtoull(text, nullptr, 10);
    return uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
}

TEST(CapiFuzz, RandomCallsFromManyThreadsNeverCrashAndLeaveTheStoreWorking) {
    mc_store_t *store = mc_store_new();
    ASSERT_NE(store, nullptr);
    mc_setup_config_t config;
    mc_setup_config_init(&config);
    config.master_server_addr = "embedded";
    ASSERT_EQ(mc_store_setup(store, &config), 0);
    const uint64_t seed = seed_from_env();
    std::printf("capi fuzz seed %llu (MC_CAPI_FUZZ_SEED)\n", static_cast<unsigned long long>(seed));
    constexpr int kThreads = 8;
    std::atomic<int> bad{0};
    std::atomic<long> calls{0};
    std::vector<std::unique_ptr<Fuzzer>> fuzzers;
    for (int t = 0; t < kThreads; ++t) fuzzers.push_back(std::make_unique<Fuzzer>(store, seed + uint64_t(t)));
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(4);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
            Fuzzer &fuzzer = *fuzzers[size_t(t)];
            for (int i = 0; i < 20000 && std::chrono::steady_clock::now() < until; ++i) {
                if (!fuzzer.step()) bad.fetch_add(1);
                calls.fetch_add(1);
            }
        });
    }
    for (auto &thread : threads) thread.join();
    std::printf("capi fuzz: %ld calls\n", calls.load());
    EXPECT_EQ(bad.load(), 0) << "calls returned codes outside their documented range";

    // Still working: exact bytes back.
    std::vector<unsigned char> value(100000), back(100000);
    for (size_t i = 0; i < value.size(); ++i) value[i] = static_cast<unsigned char>(i * 31 + 7);
    mc_store_remove(store, "fuzz/final", 1);
    // The random puts may leave the segment full of objects still under a read lease (or
    // soft-pinned) that nothing may evict yet: NO_AVAILABLE_HANDLE (-200) is then the right
    // answer until the leases end (default 5 s). Wait for that, bounded, then require success.
    const auto leases_over = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    int final_rc = mc_store_upsert(store, "fuzz/final", value.data(), value.size(), nullptr);
    while (final_rc == -200 && std::chrono::steady_clock::now() < leases_over) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        final_rc = mc_store_upsert(store, "fuzz/final", value.data(), value.size(), nullptr);
    }
    ASSERT_EQ(final_rc, 0);
    ASSERT_EQ(mc_store_get_into(store, "fuzz/final", back.data(), back.size()), int64_t(value.size()));
    EXPECT_EQ(back, value);
    for (auto &fuzzer : fuzzers)
        for (void *p : fuzzer->registered) mc_store_unregister_buffer(store, p);

    // After teardown every call is an error, never a crash.
    ASSERT_EQ(mc_store_teardown(store), 0);
    size_t n = 0;
    Fuzzer after(store, seed ^ 1);
    for (int i = 0; i < 2000; ++i) {
        void *p = after.span(&n);
        EXPECT_LT(mc_store_put(store, "fuzz/x", p == nullptr ? value.data() : p, n == 0 ? 1 : n, nullptr), 0);
        after.step();
    }
    mc_store_free(store);
}

}  // namespace
