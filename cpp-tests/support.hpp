// Shared helpers of the GoogleTest suites: deterministic data, embedded clients, and RAII handles
// for the real mooncake_master / mooncake_client processes (bounded waits, killed on scope exit).
#ifndef MOONCAKE_RS_CPP_TESTS_SUPPORT_HPP
#define MOONCAKE_RS_CPP_TESTS_SUPPORT_HPP

#include <gtest/gtest.h>
#include <mooncake_rs.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "example_proc.h"

namespace test {

constexpr int kInvalidParams = -600;
constexpr int kObjectNotFound = -704;
constexpr int kObjectHasLease = -706;
constexpr int kTransferFail = -800;
constexpr uint64_t kMiB = 1024 * 1024;

/** Deterministic bytes: every (len, seed) pair gives a different, reproducible sequence. */
inline std::vector<char> pattern(size_t len, uint32_t seed) {
    std::vector<char> out(len);
    uint32_t x = seed * 2654435761u + 1u;
    for (size_t i = 0; i < len; ++i) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        out[i] = static_cast<char>(x);
    }
    return out;
}

/** FNV-1a 64 of a byte range. */
inline uint64_t checksum(const void *data, size_t len) {
    const unsigned char *p = static_cast<const unsigned char *>(data);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; ++i) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/** The calling thread's last error detail. */
inline std::string last_error() { return mooncake_rs::RealClient::last_error_message(); }

/** A set-up client: embedded master unless `master` is given. */
inline std::unique_ptr<mooncake_rs::RealClient> make_client(const std::string &master = "embedded",
                                                            uint64_t segment = 64 * kMiB,
                                                            uint64_t local_buffer = 64 * kMiB) {
    auto client = std::make_unique<mooncake_rs::RealClient>();
    int rc = client->setup_real(master == "embedded" ? "localhost" : "127.0.0.1", "P2PHANDSHAKE",
                                segment, local_buffer, "tcp", "", master);
    EXPECT_EQ(rc, 0) << last_error();
    return rc == 0 ? std::move(client) : nullptr;
}

/** Polls `check` every 20 ms for at most `limit`; true as soon as it holds. */
inline bool wait_until(std::chrono::milliseconds limit, const std::function<bool()> &check) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
        if (check()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return check();
}

/** A number from the store's metrics JSON (the first `"name":`), or -1 when absent. */
inline int64_t metric(mc_store_t *store, const std::string &name) {
    size_t needed = 0;
    std::string json(64 * 1024, '\0');
    if (mc_store_metrics_json(store, json.data(), json.size(), &needed) != 0) {
        json.assign(needed, '\0');
        if (mc_store_metrics_json(store, json.data(), json.size(), &needed) != 0) return -1;
    }
    std::string pattern = "\"" + name + "\":";
    size_t at = json.find(pattern);
    return at == std::string::npos ? -1 : std::strtoll(json.c_str() + at + pattern.size(), nullptr, 10);
}

/** True when the process has no device runtime (the metrics say "runtime":"none"). */
inline bool no_device_runtime(mc_store_t *store) {
    std::string json(64 * 1024, '\0');
    size_t needed = 0;
    return mc_store_metrics_json(store, json.data(), json.size(), &needed) == 0 &&
           json.find("\"device_info\":{\"runtime\":\"none\"") != std::string::npos;
}

/** Bound of every wait on a stream, event or ticket in the stream suites. */
constexpr int64_t kStreamWaitMs = 20000;

/**
 * Holds a host stream: a launched function that returns only after release() (or 30 s), so
 * work enqueued behind it stays pending. The destructor releases it. The flag is shared with
 * the launched function, so destroying the blocker before the stream ran it is safe.
 */
class StreamBlocker {
public:
    explicit StreamBlocker(mc_host_stream_t *stream) {
        auto *arg = new std::shared_ptr<std::atomic<bool>>(open_);
        launched_ = mc_host_stream_launch(stream, &StreamBlocker::hold, arg);
        if (launched_ != 0) delete arg;
    }
    StreamBlocker(const StreamBlocker &) = delete;
    StreamBlocker &operator=(const StreamBlocker &) = delete;
    ~StreamBlocker() { release(); }
    /** mc_host_stream_launch's return code (0). */
    int launched() const { return launched_; }
    void release() { open_->store(true); }

private:
    static void hold(void *arg) {
        std::unique_ptr<std::shared_ptr<std::atomic<bool>>> open(
            static_cast<std::shared_ptr<std::atomic<bool>> *>(arg));
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (!(*open)->load() && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }

    std::shared_ptr<std::atomic<bool>> open_ = std::make_shared<std::atomic<bool>>(false);
    int launched_;
};

/** A real mooncake_master on a free 127.0.0.1 port (client_ttl 2 s); SIGKILLed on destruction. */
class MasterProcess {
public:
    MasterProcess() { pid_ = start_master(MOONCAKE_MASTER_BIN, &port_); }
    MasterProcess(const MasterProcess &) = delete;
    MasterProcess &operator=(const MasterProcess &) = delete;
    ~MasterProcess() { kill_now(); }
    bool running() const { return pid_ > 0; }
    std::string addr() const { return "127.0.0.1:" + std::to_string(port_); }
    void kill_now() {
        stop_child(pid_, SIGKILL, 5.0);
        pid_ = -1;
    }

private:
    pid_t pid_{-1};
    int port_{0};
};

/** A real mooncake_client process contributing a segment; SIGKILLed on destruction. */
class PeerProcess {
public:
    PeerProcess(const std::string &master_addr, const char *segment = "64 MB") {
        char name[256] = "";
        pid_ = start_peer(MOONCAKE_CLIENT_BIN, master_addr.c_str(), segment, name, sizeof name,
                          &stdout_fd_);
        name_ = name;
    }
    PeerProcess(const PeerProcess &) = delete;
    PeerProcess &operator=(const PeerProcess &) = delete;
    ~PeerProcess() { stop(SIGKILL); }
    bool running() const { return pid_ > 0; }
    /** The peer's segment name (`host:port`), usable as a preferred segment. */
    const std::string &name() const { return name_; }
    /** Sends `sig`, waits up to 10 s (then SIGKILL); returns the wait status. */
    int stop(int sig) {
        int status = stop_child(pid_, sig, 10.0);
        pid_ = -1;
        if (stdout_fd_ >= 0) close(stdout_fd_);
        stdout_fd_ = -1;
        return status;
    }

private:
    pid_t pid_{-1};
    int stdout_fd_{-1};
    std::string name_;
};

/** A fixture with one embedded client; keys are prefixed with the test's name. */
class EmbeddedTest : public ::testing::Test {
protected:
    void SetUp() override {
        client = make_client();
        ASSERT_NE(client, nullptr);
        const ::testing::TestInfo *info = ::testing::UnitTest::GetInstance()->current_test_info();
        prefix = std::string(info->test_suite_name()) + "/" + info->name() + "/";
    }
    std::string key(const std::string &name) const { return prefix + name; }

    std::unique_ptr<mooncake_rs::RealClient> client;
    std::string prefix;
};

}  // namespace test

#endif
