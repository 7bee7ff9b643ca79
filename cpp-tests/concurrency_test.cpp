// One handle, 8 threads: checksummed values written and read concurrently, with removes and
// get_buffer mixed in. Every loop is bounded by a count and by a deadline.
#include "support.hpp"

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kThreads = 8;
constexpr int kRoundsPerThread = 60;
constexpr auto kDeadline = std::chrono::seconds(60);

/** A value that carries its own checksum in its first 8 bytes. */
std::vector<char> checksummed(size_t len, uint32_t seed) {
    std::vector<char> v = test::pattern(len, seed);
    uint64_t sum = test::checksum(v.data() + 8, v.size() - 8);
    std::memcpy(v.data(), &sum, sizeof sum);
    return v;
}

bool intact(const char *data, size_t len) {
    uint64_t sum = 0;
    std::memcpy(&sum, data, sizeof sum);
    return len >= 8 && sum == test::checksum(data + 8, len - 8);
}

struct Counters {
    std::atomic<int> puts{0}, reads{0}, foreign_reads{0}, corrupt{0}, errors{0}, timeouts{0};
};

void worker(mooncake_rs::RealClient &client, int id, Counters &c,
            std::chrono::steady_clock::time_point deadline) {
    std::vector<char> out(64 * 1024);
    for (int round = 0; round < kRoundsPerThread; ++round) {
        if (std::chrono::steady_clock::now() > deadline) {
            c.timeouts++;
            return;
        }
        std::string key = "t" + std::to_string(id) + "/" + std::to_string(round);
        std::vector<char> value = checksummed(1024 + 977 * ((id * 31 + round) % 60), id * 1000 + round);
        if (client.put(key, value) != 0) c.errors++; else c.puts++;

        int64_t n = client.get_into(key, out.data(), out.size());
        if (n != static_cast<int64_t>(value.size())) c.errors++;
        else if (!intact(out.data(), n) || std::memcmp(out.data(), value.data(), n) != 0) c.corrupt++;
        else c.reads++;

        // Read a neighbour's earlier key: absent (not yet written / removed) or intact, never torn.
        std::string other = "t" + std::to_string((id + 1) % kThreads) + "/" + std::to_string(round / 2);
        std::shared_ptr<mooncake_rs::BufferHandle> handle = client.get_buffer(other);
        if (handle != nullptr) {
            if (intact(static_cast<const char *>(handle->ptr()), handle->size())) c.foreign_reads++;
            else c.corrupt++;
        }
        if (round % 3 == 2) {
            std::string old = "t" + std::to_string(id) + "/" + std::to_string(round - 2);
            int rc = client.remove(old, true);
            if (rc != 0) c.errors++;
        }
    }
}

TEST(Concurrency, EightThreadsOneHandleChecksummedValues) {
    std::unique_ptr<mooncake_rs::RealClient> client = test::make_client("embedded", 256 * test::kMiB,
                                                                        128 * test::kMiB);
    ASSERT_NE(client, nullptr);
    Counters c;
    auto deadline = std::chrono::steady_clock::now() + kDeadline;
    std::vector<std::thread> threads;
    for (int id = 0; id < kThreads; ++id)
        threads.emplace_back(worker, std::ref(*client), id, std::ref(c), deadline);
    for (std::thread &t : threads) t.join();

    EXPECT_EQ(c.timeouts.load(), 0);
    EXPECT_EQ(c.errors.load(), 0) << test::last_error();
    EXPECT_EQ(c.corrupt.load(), 0);
    EXPECT_EQ(c.puts.load(), kThreads * kRoundsPerThread);
    EXPECT_EQ(c.reads.load(), kThreads * kRoundsPerThread);
    // Each thread removed rounds 0, 3, ..., 57 (20 of its 60 keys): 40 remain per thread.
    std::vector<std::string> keys;
    for (int id = 0; id < kThreads; ++id)
        for (int round = 0; round < kRoundsPerThread; ++round)
            keys.push_back("t" + std::to_string(id) + "/" + std::to_string(round));
    std::vector<int> exist = client->batchIsExist(keys);
    int present = 0;
    for (int e : exist) present += e == 1;
    EXPECT_EQ(present, kThreads * (kRoundsPerThread - kRoundsPerThread / 3));
}

TEST(Concurrency, ConcurrentDuplicatePutsKeepOneIntactValue) {
    std::unique_ptr<mooncake_rs::RealClient> client = test::make_client();
    ASSERT_NE(client, nullptr);
    std::atomic<int> nonzero{0};
    std::vector<std::thread> threads;
    for (int id = 0; id < kThreads; ++id)
        threads.emplace_back([&, id] {
            std::vector<char> value = checksummed(32 * 1024, 7000 + id);
            for (int i = 0; i < 20; ++i)
                if (client->put("same/" + std::to_string(i), value) != 0) nonzero++;
        });
    for (std::thread &t : threads) t.join();
    EXPECT_EQ(nonzero.load(), 0);
    std::vector<char> out(32 * 1024);
    for (int i = 0; i < 20; ++i) {
        ASSERT_EQ(client->get_into("same/" + std::to_string(i), out.data(), out.size()),
                  static_cast<int64_t>(out.size()));
        EXPECT_TRUE(intact(out.data(), out.size())) << i;
    }
}

}  // namespace
