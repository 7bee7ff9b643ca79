// Multi-process scenarios on 127.0.0.1 with the real mooncake_master and mooncake_client binaries
// (paths compiled in by CMake). The master runs with client_ttl 2 s; every wait is bounded.
#include "support.hpp"

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

using mooncake_rs::RealClient;
using mooncake_rs::ReplicateConfig;
using test::MasterProcess;
using test::PeerProcess;
using test::pattern;

namespace {

constexpr auto kTtlWait = std::chrono::seconds(15);  // > client_ttl 2 s plus the sweep

class MultiProcess : public ::testing::Test {
protected:
    void SetUp() override {
        master = std::make_unique<MasterProcess>();
        ASSERT_TRUE(master->running()) << MOONCAKE_MASTER_BIN;
    }
    std::unique_ptr<RealClient> local(uint64_t segment = 16 * test::kMiB) {
        return test::make_client(master->addr(), segment, 16 * test::kMiB);
    }
    static ReplicateConfig on(const std::string &segment, size_t replicas = 1) {
        ReplicateConfig config;
        config.replica_num = replicas;
        config.preferred_segments = {segment};
        return config;
    }
    static int64_t read_into(RealClient &client, const std::string &key, std::vector<char> &out) {
        return client.get_into(key, out.data(), out.size());
    }

    std::unique_ptr<MasterProcess> master;
};

TEST_F(MultiProcess, PutOnPeerSegmentAndReadBackOverTcp) {
    PeerProcess peer(master->addr());
    ASSERT_TRUE(peer.running());
    std::unique_ptr<RealClient> client = local(0);  // no segment: every byte lives in the peer
    ASSERT_NE(client, nullptr);
    std::vector<char> value = pattern(3 * test::kMiB + 17, 1), out(value.size());
    ASSERT_EQ(client->put_from("mp/remote", value.data(), value.size(), on(peer.name())), 0)
        << test::last_error();
    ASSERT_EQ(read_into(*client, "mp/remote", out), static_cast<int64_t>(value.size()));
    EXPECT_EQ(out, value);
    std::shared_ptr<mooncake_rs::BufferHandle> handle = client->get_buffer("mp/remote");
    ASSERT_NE(handle, nullptr) << test::last_error();
    EXPECT_EQ(0, std::memcmp(handle->ptr(), value.data(), value.size()));
}

TEST_F(MultiProcess, TwoHandlesInOneProcessShareTheMaster) {
    std::unique_ptr<RealClient> writer = local(), reader = local();
    ASSERT_NE(writer, nullptr);
    ASSERT_NE(reader, nullptr);
    EXPECT_NE(writer->get_hostname(), reader->get_hostname());
    std::vector<char> value = pattern(256 * 1024, 2), out(value.size());
    ASSERT_EQ(writer->put("mp/shared", value, on(writer->get_hostname())), 0);
    ASSERT_EQ(read_into(*reader, "mp/shared", out), static_cast<int64_t>(value.size()));
    EXPECT_EQ(out, value);
    // A graceful teardown unmounts the writer's segment: its objects vanish cluster-wide.
    EXPECT_EQ(writer->tearDownAll(), 0);
    EXPECT_TRUE(test::wait_until(kTtlWait, [&] { return reader->isExist("mp/shared") == 0; }));
    EXPECT_EQ(read_into(*reader, "mp/shared", out), test::kObjectNotFound);
}

TEST_F(MultiProcess, KilledPeerLosesItsObjectsAfterClientTtl) {
    PeerProcess peer(master->addr());
    ASSERT_TRUE(peer.running());
    std::unique_ptr<RealClient> client = local();
    ASSERT_NE(client, nullptr);
    std::vector<char> on_peer = pattern(100000, 3), on_self = pattern(100000, 4), out(100000);
    ASSERT_EQ(client->put("mp/peer", on_peer, on(peer.name())), 0);
    ASSERT_EQ(client->put("mp/self", on_self, on(client->get_hostname())), 0);
    peer.stop(SIGKILL);  // no unmount: the master notices through the missing heartbeats
    EXPECT_TRUE(test::wait_until(kTtlWait, [&] { return client->isExist("mp/peer") == 0; }));
    EXPECT_LT(read_into(*client, "mp/peer", out), 0);
    ASSERT_EQ(read_into(*client, "mp/self", out), 100000);
    EXPECT_EQ(out, on_self);
}

TEST_F(MultiProcess, SecondReplicaSurvivesItsPeer) {
    PeerProcess peer(master->addr());
    ASSERT_TRUE(peer.running());
    std::unique_ptr<RealClient> client = local();
    ASSERT_NE(client, nullptr);
    ReplicateConfig both = on(peer.name(), 2);
    std::vector<char> value = pattern(500000, 5), out(value.size());
    ASSERT_EQ(client->put("mp/two", value, both), 0) << test::last_error();
    int status = peer.stop(SIGTERM);  // graceful: its replica goes, ours stays
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    ASSERT_EQ(read_into(*client, "mp/two", out), static_cast<int64_t>(value.size()))
        << test::last_error();
    EXPECT_EQ(out, value);
}

TEST_F(MultiProcess, MasterGoneMeansErrorsNotHangs) {
    std::unique_ptr<RealClient> client = local();
    ASSERT_NE(client, nullptr);
    ASSERT_EQ(client->put("mp/before", std::string("v")), 0);
    master->kill_now();
    auto start = std::chrono::steady_clock::now();
    std::vector<char> out(8);
    EXPECT_LT(read_into(*client, "mp/before", out), 0);  // metadata lives in the master
    EXPECT_LT(client->put("mp/after", std::string("v")), 0);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
    EXPECT_TRUE(test::wait_until(kTtlWait, [&] { return client->health_check() == 2; }))
        << client->health_check();
}

}  // namespace
