// On-stream gets through the C API (mc_store_*_on_stream, mc_ticket_*, mc_host_stream_*,
// mc_host_event_*), embedded master: a NULL stream gives a final ticket, device stream kinds
// without a device runtime are NOT_SUPPORTED, exhausted ticket slots give TRY_AGAIN (and come
// back), and several threads issue on their own host streams against one store. Bad arguments
// to each function are in capi_args_test. Every loop and wait is bounded.
#include "support.hpp"

#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

using test::kStreamWaitMs;
using test::StreamBlocker;

namespace {

enum class Call { BatchGetInto, MultiBuffers, Ranges };
constexpr Call kAllCalls[] = {Call::BatchGetInto, Call::MultiBuffers, Call::Ranges};
constexpr int32_t kAllKinds[] = {MC_STREAM_HOST, MC_STREAM_CUDA, MC_STREAM_ASCEND};

const char *name(Call call) {
    switch (call) {
        case Call::BatchGetInto: return "mc_store_batch_get_into_on_stream";
        case Call::MultiBuffers: return "mc_store_batch_get_into_multi_buffers_on_stream";
        case Call::Ranges: return "mc_store_get_into_ranges_on_stream";
    }
    return "?";
}

/** Issues `call` for one key read whole into `size` bytes at `out` (one fragment; Ranges needs
 *  a get session on the key). */
int issue(mc_store_t *store, Call call, const char *key, void *out, size_t size, int32_t kind,
          void *stream, mc_ticket_t **ticket) {
    size_t count = 1;
    uint64_t offset = 0;
    void *const *rows[1] = {&out};
    const size_t *sizes[1] = {&size};
    const uint64_t *offsets[1] = {&offset};
    switch (call) {
        case Call::BatchGetInto:
            return mc_store_batch_get_into_on_stream(store, &key, &out, &size, 1, kind, stream,
                                                     ticket);
        case Call::MultiBuffers:
            return mc_store_batch_get_into_multi_buffers_on_stream(store, &key, 1, rows, sizes,
                                                                   &count, kind, stream, ticket);
        case Call::Ranges:
            return mc_store_get_into_ranges_on_stream(store, &key, 1, rows, sizes, offsets, &count,
                                                      kind, stream, ticket);
    }
    return MC_ERR_INVALID_PARAMS;
}

/** A set-up embedded store (C handle) per test; `put` stores a value and opens a session. */
class StreamCapi : public ::testing::Test {
protected:
    void SetUp() override {
        store = mc_store_new();
        ASSERT_NE(store, nullptr);
        mc_setup_config_t config;
        mc_setup_config_init(&config);
        config.master_server_addr = "embedded";
        config.global_segment_size = 128 * test::kMiB;
        ASSERT_EQ(mc_store_setup(store, &config), 0) << test::last_error();
    }
    void TearDown() override { mc_store_free(store); }

    std::vector<char> put(const std::string &key, size_t size, uint32_t seed) {
        std::vector<char> value = test::pattern(size, seed);
        EXPECT_EQ(mc_store_put(store, key.c_str(), value.data(), value.size(), nullptr), 0)
            << test::last_error();
        const char *k = key.c_str();
        int started = -1;
        EXPECT_EQ(mc_store_batch_get_session_start(store, &k, 1, &started), 0);
        EXPECT_EQ(started, 0);
        return value;
    }
    void end_session(const std::string &key) {
        const char *k = key.c_str();
        EXPECT_EQ(mc_store_batch_get_session_end(store, &k, 1), 0);
    }

    mc_store_t *store = nullptr;
};

TEST_F(StreamCapi, NullStreamReturnsAFinalTicketForEveryKind) {
    std::vector<char> value = put("final", 100000, 1);
    for (Call call : kAllCalls) {
        for (int32_t kind : kAllKinds) {
            SCOPED_TRACE(std::string(name(call)) + " kind " + std::to_string(kind));
            std::vector<char> out(value.size(), 0);
            mc_ticket_t *ticket = nullptr;
            ASSERT_EQ(issue(store, call, "final", out.data(), out.size(), kind, nullptr, &ticket), 0)
                << test::last_error();
            ASSERT_NE(ticket, nullptr);
            EXPECT_EQ(mc_ticket_status(ticket), 0);  // final on return: no wait
            EXPECT_EQ(mc_ticket_wait(ticket, 0), 0);
            ASSERT_NE(mc_ticket_status_word(ticket), nullptr);
            EXPECT_EQ(*mc_ticket_status_word(ticket), 0);
            ASSERT_EQ(mc_ticket_key_count(ticket), 1u);
            int64_t read = 0;
            EXPECT_EQ(mc_ticket_results(ticket, &read, 1), 0);
            EXPECT_EQ(read, static_cast<int64_t>(value.size()));
            EXPECT_EQ(out, value);
            mc_ticket_free(ticket);
        }
    }
    end_session("final");
}

TEST_F(StreamCapi, DeviceKindsWithoutADeviceRuntimeAreNotSupported) {
    if (!test::no_device_runtime(store))
        GTEST_SKIP() << "a device runtime is loaded: a made-up stream pointer would reach it";
    std::vector<char> value = put("device", 4096, 2);
    std::vector<char> out(value.size(), 0);
    void *bogus = reinterpret_cast<void *>(uintptr_t{0x1000});
    int64_t issued = test::metric(store, "tickets_issued");
    for (Call call : kAllCalls) {
        for (int32_t kind : {MC_STREAM_CUDA, MC_STREAM_ASCEND}) {
            SCOPED_TRACE(std::string(name(call)) + " kind " + std::to_string(kind));
            mc_ticket_t *ticket = reinterpret_cast<mc_ticket_t *>(&out);  // must be reset
            EXPECT_EQ(issue(store, call, "device", out.data(), out.size(), kind, bogus, &ticket),
                      MC_ERR_NOT_SUPPORTED);
            EXPECT_EQ(ticket, nullptr);
            EXPECT_FALSE(test::last_error().empty());
        }
    }
    EXPECT_EQ(out, std::vector<char>(value.size(), 0));
    EXPECT_EQ(test::metric(store, "tickets_issued"), issued);
    end_session("device");
}

TEST_F(StreamCapi, ExhaustedTicketSlotsGiveTryAgainThenComeBack) {
    constexpr int kBound = 4096;  // above the default 1024 slots
    std::vector<char> value = put("small", 3, 3);
    std::vector<char> out(value.size(), 0);
    std::vector<mc_ticket_t *> held;
    mc_host_stream_t *stream = mc_host_stream_new();
    ASSERT_NE(stream, nullptr);
    {
        StreamBlocker blocker(stream);
        ASSERT_EQ(blocker.launched(), 0);
        int rc = 0;
        for (int i = 0; i < kBound && rc == 0; ++i) {
            mc_ticket_t *ticket = nullptr;
            rc = issue(store, Call::BatchGetInto, "small", out.data(), out.size(), MC_STREAM_HOST,
                       stream, &ticket);
            if (rc == 0) {
                held.push_back(ticket);
            } else {
                EXPECT_EQ(ticket, nullptr);
            }
        }
        EXPECT_EQ(rc, MC_ERR_TRY_AGAIN) << test::last_error();
        if (std::getenv("MC_STREAM_TICKETS") == nullptr) {
            EXPECT_EQ(held.size(), 1024u);  // the default slot count
        }
        // Every on-stream call is refused while the slots are held.
        for (Call call : kAllCalls) {
            SCOPED_TRACE(name(call));
            mc_ticket_t *ticket = nullptr;
            EXPECT_EQ(issue(store, call, "small", out.data(), out.size(), MC_STREAM_HOST, stream,
                            &ticket),
                      MC_ERR_TRY_AGAIN);
            EXPECT_EQ(ticket, nullptr);
        }
        EXPECT_GE(test::metric(store, "try_again"), 1);
        ASSERT_FALSE(held.empty());
        EXPECT_EQ(mc_ticket_status(held.front()), MC_PENDING);
        EXPECT_EQ(mc_ticket_status(held.back()), MC_PENDING);
    }  // released
    int done = 0;
    for (mc_ticket_t *ticket : held) done += mc_ticket_wait(ticket, kStreamWaitMs) == 0;
    EXPECT_EQ(done, static_cast<int>(held.size()));
    for (mc_ticket_t *ticket : held) mc_ticket_free(ticket);
    EXPECT_EQ(out, value);

    // The slots are back.
    std::vector<char> again(value.size(), 0);
    mc_ticket_t *ticket = nullptr;
    ASSERT_EQ(issue(store, Call::Ranges, "small", again.data(), again.size(), MC_STREAM_HOST,
                    stream, &ticket),
              0)
        << test::last_error();
    EXPECT_EQ(mc_ticket_wait(ticket, kStreamWaitMs), 0);
    EXPECT_EQ(again, value);
    mc_ticket_free(ticket);
    EXPECT_EQ(mc_host_stream_synchronize(stream, kStreamWaitMs), 0);
    mc_host_stream_free(stream);
    end_session("small");
}

// --- several threads, each with its own load and compute streams, one store ----------------

constexpr int kThreads = 4;
constexpr int kLayers = 8;
constexpr size_t kLayerBytes = 256 * 1024;

std::string layer_key(int layer) { return "mt/layer." + std::to_string(layer); }

/** What one thread's compute stream found for one layer. */
struct LayerCheck {
    const std::vector<char> *expected;
    const std::vector<char> *loaded;
    bool intact = false;
};

void check_layer(void *arg) {
    LayerCheck *c = static_cast<LayerCheck *>(arg);
    c->intact = *c->loaded == *c->expected;
}

/** One thread's outcome, asserted on the main thread. */
struct ThreadResult {
    int issue_failures = 0;
    int tickets_ok = 0;
    int intact_layers = 0;
    int sync_rc = -1;
};

/** Loads every layer on its own load stream (even layers through the session, odd ones with a
 *  plain on-stream get), gating a per-layer check on its compute stream with an event. */
void layer_thread(mc_store_t *store, const std::vector<std::vector<char>> &values,
                  ThreadResult &result) {
    std::vector<std::vector<char>> outs(kLayers, std::vector<char>(kLayerBytes, 0));
    std::vector<LayerCheck> checks(kLayers);
    std::vector<mc_ticket_t *> tickets(kLayers, nullptr);
    std::vector<mc_host_event_t *> events(kLayers, nullptr);
    mc_host_stream_t *load = mc_host_stream_new();
    mc_host_stream_t *compute = mc_host_stream_new();
    for (int l = 0; l < kLayers; ++l) {
        std::string key = layer_key(l);
        checks[l].expected = &values[l];
        checks[l].loaded = &outs[l];
        events[l] = mc_host_event_new();
        Call call = l % 2 == 0 ? Call::Ranges : Call::BatchGetInto;
        int rc = issue(store, call, key.c_str(), outs[l].data(), kLayerBytes, MC_STREAM_HOST, load,
                       &tickets[l]);
        if (rc == 0) rc = mc_host_event_record(events[l], load);
        if (rc == 0) rc = mc_host_stream_wait_event(compute, events[l]);
        if (rc == 0) rc = mc_host_stream_launch(compute, check_layer, &checks[l]);
        result.issue_failures += rc != 0;
    }
    result.sync_rc = mc_host_stream_synchronize(compute, kStreamWaitMs);
    for (int l = 0; l < kLayers; ++l) {
        result.tickets_ok += tickets[l] != nullptr && mc_ticket_wait(tickets[l], kStreamWaitMs) == 0;
        result.intact_layers += checks[l].intact && outs[l] == values[l];
    }
    mc_host_stream_free(compute);  // drain before the buffers and checks go away
    mc_host_stream_free(load);
    for (int l = 0; l < kLayers; ++l) {
        mc_ticket_free(tickets[l]);
        mc_host_event_free(events[l]);
    }
}

TEST_F(StreamCapi, ThreadsIssueOnTheirOwnHostStreams) {
    std::vector<std::vector<char>> values;
    for (int l = 0; l < kLayers; ++l) values.push_back(put(layer_key(l), kLayerBytes, 40 + l));
    std::vector<ThreadResult> results(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
        threads.emplace_back(layer_thread, store, std::cref(values), std::ref(results[t]));
    for (std::thread &t : threads) t.join();
    for (int t = 0; t < kThreads; ++t) {
        SCOPED_TRACE("thread " + std::to_string(t));
        EXPECT_EQ(results[t].issue_failures, 0);
        EXPECT_EQ(results[t].sync_rc, 0);
        EXPECT_EQ(results[t].tickets_ok, kLayers);
        EXPECT_EQ(results[t].intact_layers, kLayers);
    }
    // Every ticket came back: all released ok, nothing outstanding, no pin held, no slot ever
    // refused. (The housekeeper counts a release just after waking the ticket's waiters.)
    EXPECT_EQ(test::metric(store, "tickets_issued"), kThreads * kLayers);
    EXPECT_TRUE(test::wait_until(std::chrono::seconds(10), [&] {
        return test::metric(store, "tickets_ok") == kThreads * kLayers &&
               test::metric(store, "tickets_outstanding") == 0 &&
               test::metric(store, "pins_held") == 0;
    })) << "ok " << test::metric(store, "tickets_ok") << ", outstanding "
        << test::metric(store, "tickets_outstanding") << ", pins "
        << test::metric(store, "pins_held");
    EXPECT_EQ(test::metric(store, "tickets_failed"), 0);
    EXPECT_EQ(test::metric(store, "try_again"), 0);
    for (int l = 0; l < kLayers; ++l) end_session(layer_key(l));
}

}  // namespace
