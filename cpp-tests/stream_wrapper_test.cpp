// On-stream gets and puts through the C++ wrapper (HostStream, HostEvent, Ticket and the
// RealClient::*_on_stream methods), embedded master, host streams. Compiled with
// -fno-exceptions: the wrapper must not need them. Every wait is bounded.
//
// Declaration order matters on failure paths too: buffers a stream writes are declared before
// the stream (destroyed after it drained), blockers after it (released before it drains).
#include "support.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

using mooncake_rs::HostEvent;
using mooncake_rs::HostStream;
using mooncake_rs::OnStreamResult;
using mooncake_rs::Ticket;
using test::EmbeddedTest;
using test::kStreamWaitMs;
using test::pattern;
using test::StreamBlocker;

namespace {

constexpr size_t kLayer = 64 * 1024;

/** One call shape: issues a get of `value` (stored under `key`) into `out` on a stream. */
struct Shape {
    const char *name;
    std::function<OnStreamResult(mooncake_rs::RealClient &, const std::string &key,
                                 std::vector<char> &out, int32_t kind, void *stream)>
        issue;
};

/** The three on-stream calls, each reading a whole two-layer object into `out`. */
std::vector<Shape> shapes() {
    return {
        {"batch_get_into_on_stream",
         [](mooncake_rs::RealClient &c, const std::string &key, std::vector<char> &out,
            int32_t kind, void *stream) {
             return c.batch_get_into_on_stream({key}, {out.data()}, {out.size()}, kind, stream);
         }},
        {"batch_get_into_multi_buffers_on_stream",
         [](mooncake_rs::RealClient &c, const std::string &key, std::vector<char> &out,
            int32_t kind, void *stream) {
             return c.batch_get_into_multi_buffers_on_stream(
                 {key}, {{out.data(), out.data() + kLayer}}, {{kLayer, kLayer}}, kind, stream);
         }},
        {"batch_get_into_multi_buffer_ranges_on_stream",  // layer 1 first: offsets matter
         [](mooncake_rs::RealClient &c, const std::string &key, std::vector<char> &out,
            int32_t kind, void *stream) {
             return c.batch_get_into_multi_buffer_ranges_on_stream(
                 {key}, {{out.data() + kLayer, out.data()}}, {{kLayer, kLayer}}, {{kLayer, 0}},
                 kind, stream);
         }},
    };
}

class StreamWrapperTest : public EmbeddedTest {
protected:
    /** Puts a two-layer object under key(name) and opens a get session on it. */
    std::vector<char> put_kv(const std::string &name, uint32_t seed) {
        std::vector<char> value = pattern(2 * kLayer, seed);
        EXPECT_EQ(client->put(key(name), value), 0) << test::last_error();
        EXPECT_EQ(client->batch_get_session_start({key(name)}), std::vector<int>{0});
        return value;
    }

    /** The ticket is final with status 0, one key of `bytes` bytes, status word 0. */
    static void expect_done(const Ticket &ticket, size_t bytes) {
        EXPECT_EQ(ticket.wait(kStreamWaitMs), 0) << test::last_error();
        EXPECT_EQ(ticket.status(), 0);
        EXPECT_EQ(ticket.key_count(), 1u);
        EXPECT_EQ(ticket.results(), std::vector<int64_t>{static_cast<int64_t>(bytes)});
        ASSERT_NE(ticket.status_word(), nullptr);
        EXPECT_EQ(*ticket.status_word(), 0);
    }
};

TEST_F(StreamWrapperTest, HeldStreamKeepsEveryCallPendingUntilReleased) {
    uint32_t seed = 100;
    for (const Shape &shape : shapes()) {
        SCOPED_TRACE(shape.name);
        std::vector<char> value = put_kv(shape.name, seed++);
        std::vector<char> out(value.size(), 0);
        HostStream stream;
        ASSERT_TRUE(stream.valid());
        StreamBlocker blocker(stream.get());
        ASSERT_EQ(blocker.launched(), 0);
        OnStreamResult r =
            shape.issue(*client, key(shape.name), out, MC_STREAM_HOST, stream.get());
        ASSERT_EQ(r.rc, 0) << test::last_error();
        ASSERT_TRUE(r.ticket.valid());
        // The call returned while the stream is held: nothing has moved yet.
        EXPECT_EQ(r.ticket.status(), MC_PENDING);
        EXPECT_EQ(r.ticket.wait(20), MC_PENDING);
        EXPECT_EQ(stream.synchronize(0), MC_PENDING);
        EXPECT_EQ(out, std::vector<char>(value.size(), 0));
        blocker.release();
        expect_done(r.ticket, value.size());
        EXPECT_EQ(stream.synchronize(kStreamWaitMs), 0);
        EXPECT_EQ(out, value);
        EXPECT_EQ(client->batch_get_session_end({key(shape.name)}), 0);
    }
}

TEST_F(StreamWrapperTest, PutsReadTheSourceInStreamOrderAndCommitWhenFinal) {
    std::vector<char> value = pattern(3 * kLayer, 61);
    std::vector<char> src(value.size(), 0);                // produced on the stream, after the call
    std::vector<char> head = pattern(1000, 62), tail = pattern(24, 63);
    std::vector<char> out(value.size(), 0);
    HostStream stream;
    StreamBlocker blocker(stream.get());
    ASSERT_EQ(stream.launch([&] { std::copy(value.begin(), value.end(), src.begin()); }),
              0);  // the producer
    OnStreamResult one = client->batch_put_from_on_stream({key("one")}, {src.data()}, {src.size()},
                                                          {}, MC_STREAM_HOST, stream.get());
    OnStreamResult multi = client->batch_put_from_multi_buffers_on_stream(
        {key("multi")}, {{head.data(), tail.data()}}, {{head.size(), tail.size()}}, {},
        MC_STREAM_HOST, stream.get());
    ASSERT_EQ(one.rc, 0) << test::last_error();
    ASSERT_EQ(multi.rc, 0) << test::last_error();
    EXPECT_EQ(one.ticket.status(), MC_PENDING);
    EXPECT_LT(client->get_into(key("one"), out.data(), out.size()), 0);  // invisible until final
    blocker.release();
    EXPECT_EQ(one.ticket.wait(kStreamWaitMs), 0);
    EXPECT_EQ(one.ticket.results(), std::vector<int64_t>{static_cast<int64_t>(value.size())});
    EXPECT_EQ(multi.ticket.wait(kStreamWaitMs), 0);
    EXPECT_EQ(multi.ticket.results(), std::vector<int64_t>{1024});
    ASSERT_EQ(client->get_into(key("one"), out.data(), out.size()),
              static_cast<int64_t>(value.size()));
    EXPECT_EQ(out, value);  // the producer's bytes, not the zeros at call time
    std::vector<char> joined = head;
    joined.insert(joined.end(), tail.begin(), tail.end());
    std::vector<char> back(joined.size());
    EXPECT_EQ(client->get_into(key("multi"), back.data(), back.size()), 1024);
    EXPECT_EQ(back, joined);

    mooncake_rs::ReplicateConfig refused;
    refused.prefer_alloc_in_same_node = true;  // rejected before any call, as by put()
    OnStreamResult r = client->batch_put_from_on_stream({key("r")}, {src.data()}, {src.size()},
                                                        refused, MC_STREAM_HOST, stream.get());
    EXPECT_EQ(r.rc, test::kInvalidParams);
    EXPECT_FALSE(r.ticket.valid());
}

TEST_F(StreamWrapperTest, PerKeyErrorsLandInTheTicket) {
    std::vector<char> value = put_kv("present", 7);
    std::vector<char> a(value.size()), b(16);
    HostStream stream;

    // Ranges outside a session: a per-key -600, no master call. Checked first, while no
    // earlier ticket's pins are still being released (that unpin is a master call of its own,
    // made at the ticket's release point: a CI run counted it here, 6 calls for 5).
    int64_t calls = test::metric(client->handle(), "master_calls");
    OnStreamResult none = client->batch_get_into_multi_buffer_ranges_on_stream(
        {key("no-session")}, {{b.data()}}, {{b.size()}}, {{0}}, MC_STREAM_HOST, stream.get());
    ASSERT_EQ(none.rc, 0) << test::last_error();
    EXPECT_EQ(none.ticket.wait(kStreamWaitMs), test::kInvalidParams);
    EXPECT_EQ(none.ticket.results(), std::vector<int64_t>{test::kInvalidParams});
    EXPECT_EQ(test::metric(client->handle(), "master_calls"), calls);

    OnStreamResult r = client->batch_get_into_on_stream({key("present"), key("missing")},
                                                        {a.data(), b.data()}, {a.size(), b.size()},
                                                        MC_STREAM_HOST, stream.get());
    ASSERT_EQ(r.rc, 0) << test::last_error();
    EXPECT_EQ(r.ticket.wait(kStreamWaitMs), test::kObjectNotFound);
    EXPECT_EQ(r.ticket.results(),
              (std::vector<int64_t>{static_cast<int64_t>(value.size()), test::kObjectNotFound}));
    EXPECT_EQ(*r.ticket.status_word(), test::kObjectNotFound);
    EXPECT_EQ(a, value);  // the good key still arrived

    EXPECT_EQ(client->batch_get_session_end({key("present")}), 0);
}

TEST_F(StreamWrapperTest, MismatchedShapesAreRefusedWithoutACall) {
    HostStream stream;
    std::vector<char> out(8);
    int64_t issued = test::metric(client->handle(), "tickets_issued");
    std::vector<OnStreamResult> refused;
    refused.push_back(client->batch_get_into_on_stream({key("a"), key("b")}, {out.data()},
                                                       {out.size()}, MC_STREAM_HOST, stream.get()));
    refused.push_back(client->batch_get_into_multi_buffers_on_stream(
        {key("a")}, {{out.data()}}, {{4, 4}}, MC_STREAM_HOST, stream.get()));
    refused.push_back(client->batch_get_into_multi_buffer_ranges_on_stream(
        {key("a")}, {{out.data()}}, {{8}}, {{0, 0}}, MC_STREAM_HOST, stream.get()));
    refused.push_back(client->batch_put_from_on_stream({key("a")}, {out.data()}, {}, {},
                                                       MC_STREAM_HOST, stream.get()));
    refused.push_back(client->batch_put_from_multi_buffers_on_stream(
        {key("a"), key("b")}, {{out.data()}}, {{8}}, {}, MC_STREAM_HOST, stream.get()));
    for (const OnStreamResult &r : refused) {
        EXPECT_EQ(r.rc, test::kInvalidParams);
        EXPECT_FALSE(r.ticket.valid());
        // An empty Ticket answers like the C functions do for NULL.
        EXPECT_EQ(r.ticket.status(), test::kInvalidParams);
        EXPECT_EQ(r.ticket.wait(0), test::kInvalidParams);
        EXPECT_EQ(r.ticket.key_count(), 0u);
        EXPECT_TRUE(r.ticket.results().empty());
        EXPECT_EQ(r.ticket.status_word(), nullptr);
    }
    EXPECT_EQ(test::metric(client->handle(), "tickets_issued"), issued);
}

TEST_F(StreamWrapperTest, EventGatesComputeStreamOnTheLoad) {
    std::vector<char> value = put_kv("kv", 21);
    std::vector<char> out(value.size(), 0);
    bool intact = false;  // written on the compute stream, read after its synchronize
    HostStream load, compute;
    HostEvent loaded;
    EXPECT_EQ(loaded.query(), 0);  // never recorded: complete
    StreamBlocker blocker(load.get());
    OnStreamResult r = client->batch_get_into_multi_buffer_ranges_on_stream(
        {key("kv")}, {{out.data()}}, {{out.size()}}, {{0}}, MC_STREAM_HOST, load.get());
    ASSERT_EQ(r.rc, 0) << test::last_error();
    ASSERT_EQ(loaded.record(load), 0);
    ASSERT_EQ(compute.wait_event(loaded), 0);
    ASSERT_EQ(compute.launch([&] { intact = out == value; }), 0);

    EXPECT_EQ(loaded.query(), MC_PENDING);
    EXPECT_EQ(loaded.wait(20), MC_PENDING);
    EXPECT_EQ(compute.synchronize(20), MC_PENDING);
    blocker.release();
    EXPECT_EQ(compute.synchronize(kStreamWaitMs), 0);
    EXPECT_TRUE(intact);
    EXPECT_EQ(loaded.wait(kStreamWaitMs), 0);
    EXPECT_EQ(loaded.query(), 0);
    expect_done(r.ticket, value.size());
    EXPECT_EQ(client->batch_get_session_end({key("kv")}), 0);
}

TEST_F(StreamWrapperTest, LaunchRunsFunctionsAndCallablesInOrder) {
    std::vector<int> order;
    struct Step {
        std::vector<int> *order;
        int value;
    } two{&order, 2};
    HostStream stream;
    ASSERT_EQ(stream.launch([&] { order.push_back(1); }), 0);
    ASSERT_EQ(stream.launch(
                  [](void *arg) {
                      Step *s = static_cast<Step *>(arg);
                      s->order->push_back(s->value);
                  },
                  &two),
              0);
    std::function<void()> three = [&] { order.push_back(3); };
    ASSERT_EQ(stream.launch(three), 0);
    EXPECT_EQ(stream.synchronize(kStreamWaitMs), 0);
    EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

TEST_F(StreamWrapperTest, HandlesAreMoveOnlyAndEarlyFreeIsSafe) {
    std::vector<char> value = put_kv("early", 31);
    std::vector<char> out(value.size(), 0);
    HostStream first;
    HostStream stream(std::move(first));
    EXPECT_FALSE(first.valid());  // NOLINT(bugprone-use-after-move): moved-from is empty
    EXPECT_EQ(first.synchronize(0), test::kInvalidParams);
    ASSERT_TRUE(stream.valid());
    {
        StreamBlocker blocker(stream.get());
        OnStreamResult r = client->batch_get_into_on_stream({key("early")}, {out.data()},
                                                            {out.size()}, MC_STREAM_HOST,
                                                            stream.get());
        ASSERT_EQ(r.rc, 0) << test::last_error();
        Ticket moved(std::move(r.ticket));
        EXPECT_FALSE(r.ticket.valid());
        EXPECT_TRUE(moved.valid());
        EXPECT_EQ(moved.status(), MC_PENDING);
        // `moved` is freed here, before the stream reached the call.
    }
    EXPECT_EQ(stream.synchronize(kStreamWaitMs), 0);
    EXPECT_EQ(out, value);
    // The freed ticket was still released by its stream (counted just after the release).
    mc_store_t *store = client->handle();
    EXPECT_TRUE(test::wait_until(std::chrono::seconds(10), [&] {
        return test::metric(store, "tickets_outstanding") == 0 &&
               test::metric(store, "tickets_ok") == 1;
    }));
    EXPECT_EQ(test::metric(store, "tickets_issued"), 1);
    HostEvent a;
    HostEvent b(std::move(a));
    EXPECT_FALSE(a.valid());  // NOLINT(bugprone-use-after-move)
    EXPECT_EQ(a.query(), test::kInvalidParams);
    EXPECT_EQ(b.record(stream), 0);
    EXPECT_EQ(b.wait(kStreamWaitMs), 0);
    EXPECT_EQ(client->batch_get_session_end({key("early")}), 0);
}

}  // namespace
