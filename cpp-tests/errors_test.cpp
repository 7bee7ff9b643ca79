// Every error path of Mooncake's RealClient contract (spec §1 and the quirks of §8), through the
// C++ wrapper, embedded master: codes and the bytes left behind.
#include "support.hpp"

#include <cstring>
#include <string>
#include <vector>

using mooncake_rs::RealClient;
using mooncake_rs::ReplicateConfig;
using mooncake_rs::SoftPinAction;
using test::EmbeddedTest;
using test::kInvalidParams;
using test::kObjectHasLease;
using test::kObjectNotFound;
using test::pattern;

namespace {

using ErrorsTest = EmbeddedTest;

TEST_F(ErrorsTest, MissingKey) {
    char buf[16];
    EXPECT_EQ(client->get_into(key("none"), buf, sizeof buf), kObjectNotFound);
    EXPECT_EQ(client->getSize(key("none")), kObjectNotFound);
    EXPECT_EQ(client->remove(key("none")), kObjectNotFound);
    EXPECT_EQ(client->isExist(key("none")), 0);
    EXPECT_EQ(client->get_buffer(key("none")), nullptr);
    EXPECT_EQ(client->batch_get_session_start({key("none")}), std::vector<int>{kObjectNotFound});
}

TEST_F(ErrorsTest, BufferTooSmallIsInvalidParams) {
    std::vector<char> value = pattern(1000, 1);
    ASSERT_EQ(client->put(key("k"), value), 0);
    std::vector<char> small(999, 'z');
    EXPECT_EQ(client->get_into(key("k"), small.data(), small.size()), kInvalidParams);
    EXPECT_FALSE(test::last_error().empty());
    std::vector<int64_t> batch = client->batch_get_into({key("k")}, {small.data()}, {small.size()});
    EXPECT_EQ(batch, std::vector<int64_t>{kInvalidParams});
}

TEST_F(ErrorsTest, DuplicatePutKeepsTheOldValue) {
    ASSERT_EQ(client->put(key("dup"), std::string("first")), 0);
    EXPECT_EQ(client->put(key("dup"), std::string("second!")), 0);
    std::vector<char> other = pattern(5, 2);
    EXPECT_EQ(client->put_from(key("dup"), other.data(), other.size()), 0);
    char out[16] = {};
    EXPECT_EQ(client->get_into(key("dup"), out, sizeof out), 5);
    EXPECT_EQ(std::string(out, 5), "first");

    // Duplicate keys inside one batch: both succeed, one object.
    std::vector<char> a = pattern(8, 3), b = pattern(8, 4);
    EXPECT_EQ(client->batch_put_from({key("twice"), key("twice")}, {a.data(), b.data()}, {8, 8}),
              (std::vector<int>{0, 0}));
    EXPECT_EQ(client->getSize(key("twice")), 8);
}

TEST_F(ErrorsTest, ReadLeaseBlocksRemoveButForceWins) {
    ASSERT_EQ(client->put(key("leased"), std::string("v")), 0);
    EXPECT_EQ(client->remove(key("leased")), 0);  // put leaves no lease
    ASSERT_EQ(client->put(key("leased"), std::string("v")), 0);
    EXPECT_EQ(client->isExist(key("leased")), 1);  // grants a lease
    EXPECT_EQ(client->remove(key("leased")), kObjectHasLease);
    EXPECT_EQ(client->batchRemove({key("leased")}), std::vector<int>{kObjectHasLease});
    EXPECT_EQ(client->removeByRegex(key("leased")), 0);  // skipped silently
    EXPECT_EQ(client->isExist(key("leased")), 1);
    EXPECT_EQ(client->remove(key("leased"), true), 0);
    EXPECT_EQ(client->isExist(key("leased")), 0);
}

TEST_F(ErrorsTest, MismatchedBatchLengthsGiveAllInvalidParams) {
    std::vector<char> a = pattern(8, 5);
    std::vector<int> all3(3, kInvalidParams);
    std::vector<std::string> keys{key("a"), key("b"), key("c")};
    EXPECT_EQ(client->batch_put_from(keys, {a.data()}, {8, 8, 8}), all3);
    EXPECT_EQ(client->batch_upsert_from(keys, {a.data(), a.data(), a.data()}, {8}), all3);
    EXPECT_EQ(client->batch_get_into(keys, {a.data()}, {8}),
              std::vector<int64_t>(3, kInvalidParams));
    EXPECT_EQ(client->batch_put_from_multi_buffers(keys, {{a.data()}}, {{8}}), all3);
    EXPECT_EQ(client->batch_get_into_multi_buffers(keys, {{a.data()}, {a.data()}, {a.data()}},
                                                   {{8}, {8}, {8, 8}}),
              all3);
    EXPECT_EQ(client->put_batch(keys, std::vector<std::string>{"x"}), kInvalidParams);
    EXPECT_EQ(client->batch_put_session_start(keys, {8}), all3);
    EXPECT_EQ(client->batchIsExist(keys), (std::vector<int>{0, 0, 0}));  // nothing was written
}

TEST_F(ErrorsTest, OverlappingDestinationsAreRejected) {
    ASSERT_EQ(client->put(key("o1"), std::string("12345678")), 0);
    ASSERT_EQ(client->put(key("o2"), std::string("abcdefgh")), 0);
    std::vector<char> shared(16, 'z');
    EXPECT_EQ(client->batch_get_into({key("o1"), key("o2")}, {shared.data(), shared.data() + 4},
                                     {8, 8}),
              (std::vector<int64_t>{kInvalidParams, kInvalidParams}));
    EXPECT_EQ(shared, std::vector<char>(16, 'z'));  // nothing written
}

TEST_F(ErrorsTest, ZeroSizeWritesAreNoOps) {
    char byte = 'x';
    EXPECT_EQ(client->put_from(key("empty"), &byte, 0), 0);
    EXPECT_EQ(client->upsert_from(key("empty"), &byte, 0), 0);
    EXPECT_EQ(client->put_parts(key("empty"), std::vector<std::string>{"", ""}), 0);
    EXPECT_EQ(client->isExist(key("empty")), 0);
    EXPECT_EQ(client->batchIsExist({}), std::vector<int>{});
    EXPECT_EQ(client->batch_get_into({}, {}, {}), std::vector<int64_t>{});
}

TEST_F(ErrorsTest, MultiBufferSizesMustMatchTheObject) {
    std::vector<char> value = pattern(100, 6);
    ASSERT_EQ(client->put(key("m"), value), 0);
    std::vector<char> x(60), y(60);
    EXPECT_EQ(client->batch_get_into_multi_buffers({key("m")}, {{x.data()}}, {{60}}),
              std::vector<int>{kInvalidParams});  // less than the object
    EXPECT_EQ(client->batch_get_into_multi_buffers({key("m")}, {{x.data(), y.data()}}, {{60, 60}}),
              std::vector<int>{test::kTransferFail});  // more than the object
}

TEST_F(ErrorsTest, BadReplicateConfigs) {
    ReplicateConfig zero;
    zero.replica_num = 0;
    EXPECT_EQ(client->put(key("c0"), std::string("v"), zero), kInvalidParams);
    ReplicateConfig same_node;
    same_node.prefer_alloc_in_same_node = true;
    EXPECT_EQ(client->put(key("c1"), std::string("v"), same_node), kInvalidParams);
    EXPECT_EQ(client->upsert(key("c1"), std::string("v"), same_node), kInvalidParams);
    ReplicateConfig ttl_without_enable;
    ttl_without_enable.soft_pin_action = SoftPinAction::DISABLE;
    ttl_without_enable.soft_pin_ttl_ms = 1000;
    EXPECT_EQ(client->put(key("c2"), std::string("v"), ttl_without_enable), kInvalidParams);
    EXPECT_EQ(client->put("", std::string("v")), kInvalidParams);  // empty key
    EXPECT_EQ(client->batchIsExist({key("c0"), key("c1"), key("c2")}), (std::vector<int>{0, 0, 0}));
}

TEST_F(ErrorsTest, RemoveEdgeCases) {
    EXPECT_EQ(client->removeByRegex("([unclosed"), kInvalidParams);
    EXPECT_EQ(client->removeAll(), 0);  // empty store
    ReplicateConfig hard;
    hard.with_hard_pin = true;
    ASSERT_EQ(client->put(key("hard"), std::string("v"), hard), 0);
    EXPECT_EQ(client->remove(key("hard")), 0);  // hard pin does not block remove (quirk 9)
}

TEST_F(ErrorsTest, SessionErrors) {
    ASSERT_EQ(client->put(key("exists"), std::string("v")), 0);
    EXPECT_EQ(client->batch_put_session_start({key("exists")}, {1}),
              std::vector<int>{-705});  // no "exists = success" mapping here
    EXPECT_EQ(client->batch_put_session_end({key("no-session")}), std::vector<int>{kInvalidParams});
    EXPECT_EQ(client->batch_put_session_start({key("s")}, {16}), std::vector<int>{0});
    EXPECT_EQ(client->batch_put_session_start({key("s")}, {16}), std::vector<int>{kInvalidParams});
    std::vector<char> big(32);
    EXPECT_EQ(client->batch_put_from_multi_buffer_ranges({key("s")}, {{big.data()}}, {{32}}, {{0}}),
              std::vector<int>{kInvalidParams});  // past the object's end
    EXPECT_EQ(client->batch_put_session_end({key("s")}), std::vector<int>{0});
    EXPECT_EQ(client->batch_put_session_end({key("s")}), std::vector<int>{kInvalidParams});
    std::vector<char> out(16);
    EXPECT_EQ(client->batch_get_into_multi_buffer_ranges({key("s")}, {{out.data()}}, {{16}}, {{0}}),
              std::vector<int>{kInvalidParams});  // no get session
}

TEST(ErrorsLifecycle, BeforeSetupEverythingIsInvalidParams) {
    RealClient client;
    char buf[8] = {};
    EXPECT_EQ(client.health_check(), 1);
    EXPECT_EQ(client.put("k", std::string("v")), kInvalidParams);
    EXPECT_EQ(client.put_from("k", buf, sizeof buf), kInvalidParams);
    EXPECT_EQ(client.upsert("k", std::string("v")), kInvalidParams);
    EXPECT_EQ(client.get_into("k", buf, sizeof buf), kInvalidParams);
    EXPECT_EQ(client.getSize("k"), kInvalidParams);
    EXPECT_EQ(client.isExist("k"), kInvalidParams);
    EXPECT_EQ(client.remove("k"), kInvalidParams);
    EXPECT_EQ(client.removeAll(), kInvalidParams);
    EXPECT_EQ(client.removeByRegex("k"), kInvalidParams);
    EXPECT_EQ(client.register_buffer(buf, sizeof buf), kInvalidParams);
    EXPECT_EQ(client.batchIsExist({"a", "b"}), (std::vector<int>{kInvalidParams, kInvalidParams}));
    EXPECT_EQ(client.batch_get_into({"a"}, {buf}, {8}), std::vector<int64_t>{kInvalidParams});
    EXPECT_EQ(client.batch_get_session_start({"a"}), std::vector<int>{kInvalidParams});
    EXPECT_EQ(client.get_buffer("k"), nullptr);
    EXPECT_EQ(client.get_hostname(), "");
    EXPECT_EQ(client.tearDownAll(), 0);
}

TEST(ErrorsLifecycle, SecondSetupAndAfterTeardown) {
    std::unique_ptr<RealClient> client = test::make_client();
    ASSERT_NE(client, nullptr);
    EXPECT_EQ(client->setup_real("localhost", "P2PHANDSHAKE", 1 << 20, 1 << 20, "tcp", "",
                                 "embedded"),
              kInvalidParams);
    ASSERT_EQ(client->put("k", std::string("v")), 0);
    EXPECT_EQ(client->tearDownAll(), 0);
    char buf[4];
    EXPECT_EQ(client->get_into("k", buf, sizeof buf), kInvalidParams);
    EXPECT_EQ(client->health_check(), 1);
}

TEST(ErrorsLifecycle, SetupArgumentValidation) {
    RealClient bad_segment;
    EXPECT_EQ(bad_segment.setup_real("localhost", "P2PHANDSHAKE", 1000, 1 << 20, "tcp", "",
                                     "embedded"),
              kInvalidParams);  // segment must be 0 or >= 1024
    RealClient empty_host;
    EXPECT_EQ(empty_host.setup_real("", "P2PHANDSHAKE", 1 << 20, 1 << 20, "tcp", "", "embedded"),
              kInvalidParams);
    RealClient no_master;  // nobody listens on 127.0.0.1:1
    EXPECT_LT(no_master.setup_real("127.0.0.1", "P2PHANDSHAKE", 1 << 20, 1 << 20, "tcp", "",
                                   "127.0.0.1:1"),
              0);
}

TEST(ErrorsLifecycle, CopyingPutNeedsLocalBuffer) {
    std::unique_ptr<RealClient> client = test::make_client("embedded", 16 * test::kMiB, 0);
    ASSERT_NE(client, nullptr);
    EXPECT_EQ(client->put("k", std::string("v")), kInvalidParams);  // quirk 12
    std::vector<char> v = pattern(16, 7);
    EXPECT_EQ(client->put_from("k", v.data(), v.size()), 0);  // zero-copy needs no local buffer
    EXPECT_EQ(client->get_buffer("k"), nullptr);              // get_buffer does
}

}  // namespace
