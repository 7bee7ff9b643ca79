/**
 * @file mooncake_rs.hpp
 * @brief Header-only C++17 wrapper over the mooncake-rs C API (mooncake_rs.h), shaped like
 *        Mooncake's `mooncake::RealClient` / `PyClient`.
 *
 * Porting from Mooncake: replace `#include "real_client.h"` with `#include <mooncake_rs.hpp>` and
 * `mooncake::` with `mooncake_rs::`. Method names, parameter order, parameter types and return
 * conventions are Mooncake's:
 *   - single operations return `int` (0 or a negative Mooncake ErrorCode);
 *   - reads return `int64_t` (a byte count or a negative ErrorCode);
 *   - batch operations return one entry per key, in input order; when the top-level vectors have
 *     different lengths every entry is -600 (INVALID_PARAMS) and nothing is called;
 *   - before setup / after tearDownAll every data call gives -600.
 *
 * No exceptions are thrown by this header (it compiles with -fno-exceptions); an allocation
 * failure inside std::vector behaves as the standard library does in that mode.
 *
 * Thread safety: one RealClient may be used from any number of threads at once (the C handle is
 * thread-safe). A BufferHandle is immutable and may be read from any thread.
 *
 * Ownership: RealClient owns its `mc_store_t` (freed, and torn down, by the destructor).
 * BufferHandle owns its `mc_buffer_t` (freed by the destructor). Caller buffers passed to
 * put_from / get_into / the batch variants are borrowed for the duration of the call only.
 *
 * On-stream calls (`*_on_stream`, docs/c-api.md "On-stream gets (and puts)"): HostStream,
 * HostEvent and Ticket own their C handles (move-only, freed by the destructor). The buffers of
 * an on-stream call (get destinations, put sources) are borrowed until the stream has passed
 * the call, not just for the call.
 */
#ifndef MOONCAKE_RS_HPP
#define MOONCAKE_RS_HPP

#include <mooncake_rs.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace mooncake_rs {

/** Mooncake's INVALID_PARAMS, returned for argument and shape errors. */
constexpr int kInvalidParams = -600;

/** Mooncake's SoftPinAction (replica.h). */
enum class SoftPinAction : int32_t { PRESERVE = 0, ENABLE = 1, DISABLE = 2 };

/**
 * Mooncake's ReplicateConfig (replica.h), restricted to what the store honours.
 *
 * `with_soft_pin` is the older boolean spelling; when true and `soft_pin_action` is PRESERVE it
 * means ENABLE. `preferred_segment` (deprecated in Mooncake) is used instead of
 * `preferred_segments` when non-empty, as in Mooncake. `prefer_alloc_in_same_node` is rejected
 * with -600 by every put/upsert, as in Mooncake's RealClient.
 */
struct ReplicateConfig {
    size_t replica_num{1};                      ///< memory replicas, best effort, >= 1
    bool with_soft_pin{false};                  ///< older spelling of soft_pin_action = ENABLE
    SoftPinAction soft_pin_action{SoftPinAction::PRESERVE};
    std::optional<uint64_t> soft_pin_ttl_ms{};  ///< only with ENABLE
    bool with_hard_pin{false};                  ///< never evicted
    std::vector<std::string> preferred_segments{};  ///< segment names (`host:port`), in order
    std::string preferred_segment{};            ///< deprecated single preference
    bool prefer_alloc_in_same_node{false};      ///< rejected (-600) by puts, as in Mooncake
};

namespace detail {

/** A C view of a ReplicateConfig; keeps the segment-name pointers alive while it lives. */
class CConfig {
public:
    explicit CConfig(const ReplicateConfig &config) {
        mc_replicate_config_init(&c_);
        c_.replica_num = config.replica_num;
        SoftPinAction action = config.soft_pin_action;
        if (config.with_soft_pin && action == SoftPinAction::PRESERVE) action = SoftPinAction::ENABLE;
        c_.soft_pin_action = static_cast<int32_t>(action);
        c_.soft_pin_ttl_ms =
            config.soft_pin_ttl_ms ? static_cast<int64_t>(*config.soft_pin_ttl_ms) : -1;
        c_.with_hard_pin = config.with_hard_pin ? 1 : 0;
        if (!config.preferred_segment.empty()) {
            names_.push_back(config.preferred_segment.c_str());
        } else {
            for (const std::string &name : config.preferred_segments) names_.push_back(name.c_str());
        }
        c_.preferred_segments = names_.empty() ? nullptr : names_.data();
        c_.preferred_segments_count = names_.size();
        rejected_ = config.prefer_alloc_in_same_node;
    }
    CConfig(const CConfig &) = delete;
    CConfig &operator=(const CConfig &) = delete;

    const mc_replicate_config_t *get() const { return &c_; }
    /** True when Mooncake's RealClient would refuse this config before any I/O. */
    bool rejected() const { return rejected_; }

private:
    mc_replicate_config_t c_{};
    std::vector<const char *> names_;
    bool rejected_{false};
};

/** C string pointers for a vector of std::string (valid while `keys` lives). */
inline std::vector<const char *> c_keys(const std::vector<std::string> &keys) {
    std::vector<const char *> out;
    out.reserve(keys.size());
    for (const std::string &key : keys) out.push_back(key.c_str());
    return out;
}

/** Pointer/length rows of a vector of vectors, plus the row lengths, for the multi-buffer calls. */
template <class T>
struct Rows {
    std::vector<const T *> ptrs;
    std::vector<size_t> counts;
    explicit Rows(const std::vector<std::vector<T>> &rows) {
        ptrs.reserve(rows.size());
        counts.reserve(rows.size());
        for (const std::vector<T> &row : rows) {
            ptrs.push_back(row.data());
            counts.push_back(row.size());
        }
    }
};

/** True when every row of `a` has the same length as the matching row of `b`. */
template <class A, class B>
bool same_shape(const std::vector<std::vector<A>> &a, const std::vector<std::vector<B>> &b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (a[i].size() != b[i].size()) return false;
    return true;
}

/** Runs a C batch call that fills `int`-like per-key results; a call-level error fills all. */
template <class R, class Call>
std::vector<R> per_key(size_t count, bool shapes_ok, Call call) {
    std::vector<R> results(count, static_cast<R>(kInvalidParams));
    if (!shapes_ok || count == 0) return results;
    int rc = call(results.data());
    if (rc < 0) results.assign(count, static_cast<R>(rc));
    return results;
}

/** Narrowing copy of per-key results (Mooncake returns vector<int> where the C API has int64_t). */
inline std::vector<int> to_int(const std::vector<int64_t> &in) {
    return std::vector<int>(in.begin(), in.end());
}

/** Anything with data() and size() over 1-byte elements: std::string, std::vector<char>, span. */
template <class T, class = void>
struct is_bytes : std::false_type {};
template <class T>
struct is_bytes<T, std::void_t<decltype(std::declval<const T &>().data()),
                               decltype(std::declval<const T &>().size())>>
    : std::bool_constant<sizeof(*std::declval<const T &>().data()) == 1> {};

}  // namespace detail

/**
 * The result of get_buffer: the object's bytes in library-owned memory.
 * Move-only; the destructor frees the buffer (mc_buffer_free). ptr() stays valid while the handle
 * lives. Mirrors Mooncake's BufferHandle (ptr(), size()).
 */
class BufferHandle {
public:
    /** Takes ownership of `buffer` (may be NULL: an empty handle). */
    explicit BufferHandle(mc_buffer_t *buffer) noexcept : buffer_(buffer) {}
    BufferHandle(BufferHandle &&other) noexcept : buffer_(std::exchange(other.buffer_, nullptr)) {}
    BufferHandle &operator=(BufferHandle &&other) noexcept {
        if (this != &other) {
            mc_buffer_free(buffer_);
            buffer_ = std::exchange(other.buffer_, nullptr);
        }
        return *this;
    }
    BufferHandle(const BufferHandle &) = delete;
    BufferHandle &operator=(const BufferHandle &) = delete;
    ~BufferHandle() { mc_buffer_free(buffer_); }

    /** First byte of the object (NULL for an empty handle). */
    void *ptr() const noexcept { return const_cast<void *>(mc_buffer_ptr(buffer_)); }
    /** Object size in bytes. */
    size_t size() const noexcept { return mc_buffer_len(buffer_); }

private:
    mc_buffer_t *buffer_;
};

class HostEvent;

/**
 * A host stream (mc_host_stream_t): functions and on-stream calls run in enqueue order on one
 * dedicated thread. Move-only; the destructor runs everything already enqueued, then frees the
 * stream (so a launched function that never returns blocks it: release blockers first).
 * Pass it to the `*_on_stream` methods as `(MC_STREAM_HOST, stream.get())`.
 */
class HostStream {
public:
    /** A new stream; `valid()` is false when its thread could not start. */
    HostStream() noexcept : stream_(mc_host_stream_new()) {}
    HostStream(HostStream &&other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}
    HostStream &operator=(HostStream &&other) noexcept {
        if (this != &other) {
            mc_host_stream_free(stream_);
            stream_ = std::exchange(other.stream_, nullptr);
        }
        return *this;
    }
    HostStream(const HostStream &) = delete;
    HostStream &operator=(const HostStream &) = delete;
    ~HostStream() { mc_host_stream_free(stream_); }

    bool valid() const noexcept { return stream_ != nullptr; }
    /** The C handle, e.g. the `stream` argument of an on-stream call with MC_STREAM_HOST. */
    mc_host_stream_t *get() const noexcept { return stream_; }

    /** Enqueues `fn(arg)` (a host "kernel"); `arg` must stay valid until it ran. 0 or -600. */
    int launch(void (*fn)(void *), void *arg) noexcept {
        return mc_host_stream_launch(stream_, fn, arg);
    }
    /** Enqueues a copy of `f` (any callable `void()`); it runs once, in stream order. */
    template <class F, class = std::enable_if_t<std::is_invocable_r_v<void, std::decay_t<F> &>>>
    int launch(F &&f) {
        using Fn = std::decay_t<F>;
        Fn *copy = new Fn(std::forward<F>(f));
        int rc = mc_host_stream_launch(stream_, &run_once<Fn>, copy);
        if (rc != 0) delete copy;
        return rc;
    }
    /** Later work on this stream waits for `event`'s most recent record. 0 or -600. */
    inline int wait_event(const HostEvent &event) noexcept;
    /** Waits for everything enqueued so far: 0, or MC_PENDING after `timeout_ms` (< 0: none). */
    int synchronize(int64_t timeout_ms = -1) noexcept {
        return mc_host_stream_synchronize(stream_, timeout_ms);
    }

private:
    template <class Fn>
    static void run_once(void *arg) {
        std::unique_ptr<Fn> f(static_cast<Fn *>(arg));
        (*f)();
    }

    mc_host_stream_t *stream_;
};

/**
 * A host event (mc_host_event_t): a point in a host stream that streams or threads can wait
 * for. Move-only; never recorded, it counts as complete.
 */
class HostEvent {
public:
    HostEvent() noexcept : event_(mc_host_event_new()) {}
    HostEvent(HostEvent &&other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
    HostEvent &operator=(HostEvent &&other) noexcept {
        if (this != &other) {
            mc_host_event_free(event_);
            event_ = std::exchange(other.event_, nullptr);
        }
        return *this;
    }
    HostEvent(const HostEvent &) = delete;
    HostEvent &operator=(const HostEvent &) = delete;
    ~HostEvent() { mc_host_event_free(event_); }

    bool valid() const noexcept { return event_ != nullptr; }
    mc_host_event_t *get() const noexcept { return event_; }

    /** Completes when `stream` has run everything enqueued before this call. 0 or -600. */
    int record(HostStream &stream) noexcept { return mc_host_event_record(event_, stream.get()); }
    /** 0 when the most recent record completed, MC_PENDING otherwise; -600 for an empty event. */
    int query() const noexcept { return mc_host_event_query(event_); }
    /** Waits for the most recent record: 0, or MC_PENDING after `timeout_ms` (< 0: none). */
    int wait(int64_t timeout_ms = -1) const noexcept { return mc_host_event_wait(event_, timeout_ms); }

private:
    mc_host_event_t *event_;
};

inline int HostStream::wait_event(const HostEvent &event) noexcept {
    return mc_host_stream_wait_event(stream_, event.get());
}

/**
 * The outcome of one on-stream call (mc_ticket_t). Move-only; the destructor frees it, which is
 * safe before the stream reached the call. An empty Ticket (failed call, moved-from) answers
 * -600 / no results.
 */
class Ticket {
public:
    Ticket() noexcept = default;
    /** Takes ownership of `ticket` (may be NULL). */
    explicit Ticket(mc_ticket_t *ticket) noexcept : ticket_(ticket) {}
    Ticket(Ticket &&other) noexcept : ticket_(std::exchange(other.ticket_, nullptr)) {}
    Ticket &operator=(Ticket &&other) noexcept {
        if (this != &other) {
            mc_ticket_free(ticket_);
            ticket_ = std::exchange(other.ticket_, nullptr);
        }
        return *this;
    }
    Ticket(const Ticket &) = delete;
    Ticket &operator=(const Ticket &) = delete;
    ~Ticket() { mc_ticket_free(ticket_); }

    bool valid() const noexcept { return ticket_ != nullptr; }
    mc_ticket_t *get() const noexcept { return ticket_; }

    /** MC_PENDING until the stream passed the call, then 0 or the first error. */
    int status() const noexcept { return mc_ticket_status(ticket_); }
    /** Waits for the final status; MC_PENDING after `timeout_ms` (< 0: no limit). */
    int wait(int64_t timeout_ms = -1) const noexcept { return mc_ticket_wait(ticket_, timeout_ms); }
    /** Number of keys of the call. */
    size_t key_count() const noexcept { return mc_ticket_key_count(ticket_); }
    /** Per key, in call order: bytes read or the key's error (final once status() is). */
    std::vector<int64_t> results() const {
        std::vector<int64_t> out(key_count(), kInvalidParams);
        if (!out.empty()) {
            int rc = mc_ticket_results(ticket_, out.data(), out.size());
            if (rc < 0) out.assign(out.size(), rc);
        }
        return out;
    }
    /**
     * The device-readable status word: MC_PENDING until the call's data is known, then 0 or a
     * negative code (final before work enqueued after the call runs). Valid while this Ticket
     * lives; nullptr for an empty Ticket.
     */
    const int32_t *status_word() const noexcept { return mc_ticket_status_word(ticket_); }

private:
    mc_ticket_t *ticket_{nullptr};
};

/** What an on-stream call returns: `rc` 0 and a ticket, or a negative code and no ticket. */
struct OnStreamResult {
    int rc;
    Ticket ticket;
};

/**
 * A Mooncake Store client (RealClient). Create with `create()` (or construct directly), then
 * `setup_real` (or `initAll`). The destructor calls tearDownAll and frees the handle.
 */
class RealClient {
public:
    RealClient() noexcept : store_(mc_store_new()) {}
    RealClient(const RealClient &) = delete;
    RealClient &operator=(const RealClient &) = delete;
    ~RealClient() { mc_store_free(store_); }

    /** Mooncake's factory; returns nullptr only if the handle cannot be allocated. */
    static std::shared_ptr<RealClient> create() {
        std::shared_ptr<RealClient> client = std::make_shared<RealClient>();
        return client->store_ != nullptr ? client : nullptr;
    }

    /** The underlying C handle (owned by this object), for calls the wrapper does not cover. */
    mc_store_t *handle() const noexcept { return store_; }

    /** The calling thread's detail message for the last failed mc_* call ("" if none). */
    static std::string last_error_message() {
        size_t len = mc_last_error_message(nullptr, 0);
        std::string text(len + 1, '\0');
        mc_last_error_message(text.data(), text.size());
        text.resize(len);
        return text;
    }

    /** The ErrorCode name of `code` ("OBJECT_NOT_FOUND", ...). */
    static const char *strerror(int64_t code) noexcept { return mc_strerror(code); }

    /**
     * Makes `path` this process's cluster key file (mc_set_cluster_key_file): call before the
     * first setup. Returns 0, -600 or -1101 (see the C function).
     */
    static int set_cluster_key_file(const std::string &path) noexcept {
        return mc_set_cluster_key_file(path.c_str());
    }

    // --- lifecycle -----------------------------------------------------------------------------

    /**
     * Mounts `global_segment_size` bytes into the pool and connects to `master_server_addr`
     * (`"embedded"` or "" runs the master in this process). Returns 0, or -600 on bad arguments
     * or a second setup, or the connection error.
     */
    int setup_real(const std::string &local_hostname, const std::string &metadata_server,
                   size_t global_segment_size = 16 * 1024 * 1024,
                   size_t local_buffer_size = 16 * 1024 * 1024,
                   const std::string &protocol = "tcp", const std::string &rdma_devices = "",
                   const std::string &master_server_addr = "127.0.0.1:50051") {
        mc_setup_config_t config;
        mc_setup_config_init(&config);
        config.local_hostname = local_hostname.c_str();
        config.metadata_server = metadata_server.c_str();
        config.global_segment_size = global_segment_size;
        config.local_buffer_size = local_buffer_size;
        config.protocol = protocol.c_str();
        config.device_name = rdma_devices.c_str();
        config.master_server_addr = master_server_addr.c_str();
        return mc_store_setup(store_, &config);
    }

    /** Mooncake's initAll: setup with Mooncake's fixed host/metadata defaults. */
    int initAll(const std::string &protocol, const std::string &device_name,
                size_t mount_segment_size = 16 * 1024 * 1024) {
        return mc_store_init_all(store_, protocol.c_str(), device_name.c_str(), mount_segment_size);
    }

    /**
     * Attaches as a dummy of the real client `server_address` (`host:port`, a `mooncake_client`
     * on this host; see docs/standalone.md): no segment, the local buffer in shared memory, every
     * call carried out by the real client. `mem_pool_size` is unused (as upstream). Returns 0, or
     * -600 (no real client there, bad address, already set up), or the master's error.
     */
    int setup_dummy(size_t mem_pool_size, size_t local_buffer_size,
                    const std::string &server_address) {
        return mc_store_setup_dummy(store_, mem_pool_size, local_buffer_size,
                                    server_address.c_str());
    }

    /** Unmounts and disconnects; idempotent; always 0. */
    int tearDownAll() { return mc_store_teardown(store_); }

    /** 0 healthy, 1 not initialised, 2 master unreachable. */
    int health_check() { return mc_store_health_check(store_); }

    /** This client's segment name (`host:port`), "" before setup. */
    std::string get_hostname() {
        char buf[512];
        return mc_store_get_hostname(store_, buf, sizeof buf) == 0 ? std::string(buf)
                                                                     : std::string();
    }

    /** Registers caller memory for zero-copy transfers; also used to size get_into_ranges. */
    int register_buffer(void *buffer, size_t size) {
        int rc = mc_store_register_buffer(store_, buffer, size);
        if (rc == 0) {
            std::lock_guard<std::mutex> lock(regions_mutex_);
            regions_[reinterpret_cast<uintptr_t>(buffer)] = size;
        }
        return rc;
    }

    /** Unregisters a region registered with register_buffer (-600 if unknown). */
    int unregister_buffer(void *buffer) {
        int rc = mc_store_unregister_buffer(store_, buffer);
        if (rc == 0) {
            std::lock_guard<std::mutex> lock(regions_mutex_);
            regions_.erase(reinterpret_cast<uintptr_t>(buffer));
        }
        return rc;
    }

    // --- put family (insert if absent; an existing key keeps its value and gives 0) -------------

    /** Copying put of `value` (std::string, std::vector<char>, std::span<const char>, ...). */
    template <class Bytes, class = std::enable_if_t<detail::is_bytes<Bytes>::value>>
    int put(const std::string &key, const Bytes &value, const ReplicateConfig &config = {}) {
        return put(key, value.data(), value.size(), config);
    }
    /** Copying put of `size` bytes at `value`. */
    int put(const std::string &key, const void *value, size_t size,
            const ReplicateConfig &config = {}) {
        return single(config, [&](const mc_replicate_config_t *c) {
            return mc_store_put(store_, key.c_str(), value, size, c);
        });
    }
    /** Zero-copy put from `buffer`; size 0 is a no-op returning 0. */
    int put_from(const std::string &key, void *buffer, size_t size,
                 const ReplicateConfig &config = {}) {
        return single(config, [&](const mc_replicate_config_t *c) {
            return mc_store_put_from(store_, key.c_str(), buffer, size, c);
        });
    }
    /** The object is the concatenation of `values`; a total of 0 bytes is a no-op. */
    template <class Bytes>
    int put_parts(const std::string &key, const std::vector<Bytes> &values,
                  const ReplicateConfig &config = {}) {
        return parts(key, values, config, &mc_store_put_parts);
    }
    /** Copying batch put; 0 if all succeeded, else the first per-key error. */
    template <class Bytes>
    int put_batch(const std::vector<std::string> &keys, const std::vector<Bytes> &values,
                  const ReplicateConfig &config = {}) {
        return batch_copy(keys, values, config, &mc_store_put_batch);
    }
    /** Zero-copy batch put; one result per key. */
    std::vector<int> batch_put_from(const std::vector<std::string> &keys,
                                    const std::vector<void *> &buffers,
                                    const std::vector<size_t> &sizes,
                                    const ReplicateConfig &config = {}) {
        return batch_from(keys, buffers, sizes, config, &mc_store_batch_put_from);
    }
    /** Each key's object is the concatenation of its buffers; one result per key. */
    std::vector<int> batch_put_from_multi_buffers(
        const std::vector<std::string> &keys, const std::vector<std::vector<void *>> &all_buffers,
        const std::vector<std::vector<size_t>> &all_sizes, const ReplicateConfig &config = {}) {
        return batch_multi(keys, all_buffers, all_sizes, config,
                           &mc_store_batch_put_from_multi_buffers);
    }

    // --- upsert family (insert or overwrite); same shapes as the put family -----------------------

    /** Copying upsert of `value`. */
    template <class Bytes, class = std::enable_if_t<detail::is_bytes<Bytes>::value>>
    int upsert(const std::string &key, const Bytes &value, const ReplicateConfig &config = {}) {
        return upsert(key, value.data(), value.size(), config);
    }
    /** Copying upsert of `size` bytes at `value`. */
    int upsert(const std::string &key, const void *value, size_t size,
               const ReplicateConfig &config = {}) {
        return single(config, [&](const mc_replicate_config_t *c) {
            return mc_store_upsert(store_, key.c_str(), value, size, c);
        });
    }
    /** Zero-copy upsert from `buffer`. */
    int upsert_from(const std::string &key, void *buffer, size_t size,
                    const ReplicateConfig &config = {}) {
        return single(config, [&](const mc_replicate_config_t *c) {
            return mc_store_upsert_from(store_, key.c_str(), buffer, size, c);
        });
    }
    /** Upsert of the concatenation of `values`. */
    template <class Bytes>
    int upsert_parts(const std::string &key, const std::vector<Bytes> &values,
                     const ReplicateConfig &config = {}) {
        return parts(key, values, config, &mc_store_upsert_parts);
    }
    /** Copying batch upsert; 0 or the first per-key error. */
    template <class Bytes>
    int upsert_batch(const std::vector<std::string> &keys, const std::vector<Bytes> &values,
                     const ReplicateConfig &config = {}) {
        return batch_copy(keys, values, config, &mc_store_upsert_batch);
    }
    /** Zero-copy batch upsert; one result per key. */
    std::vector<int> batch_upsert_from(const std::vector<std::string> &keys,
                                       const std::vector<void *> &buffers,
                                       const std::vector<size_t> &sizes,
                                       const ReplicateConfig &config = {}) {
        return batch_from(keys, buffers, sizes, config, &mc_store_batch_upsert_from);
    }
    /** Multi-buffer batch upsert; one result per key. */
    std::vector<int> batch_upsert_from_multi_buffers(
        const std::vector<std::string> &keys, const std::vector<std::vector<void *>> &all_buffers,
        const std::vector<std::vector<size_t>> &all_sizes, const ReplicateConfig &config = {}) {
        return batch_multi(keys, all_buffers, all_sizes, config,
                           &mc_store_batch_upsert_from_multi_buffers);
    }

    // --- get family (reads grant a read lease) ------------------------------------------------

    /** Reads the whole object into `buffer`: bytes, -600 if `size` is too small, -704 missing. */
    int64_t get_into(const std::string &key, void *buffer, size_t size) {
        return mc_store_get_into(store_, key.c_str(), buffer, size);
    }
    /** Batched get_into; one byte count or error per key. */
    std::vector<int64_t> batch_get_into(const std::vector<std::string> &keys,
                                        const std::vector<void *> &buffers,
                                        const std::vector<size_t> &sizes) {
        std::vector<const char *> c = detail::c_keys(keys);
        return detail::per_key<int64_t>(
            keys.size(), buffers.size() == keys.size() && sizes.size() == keys.size(),
            [&](int64_t *out) {
                return mc_store_batch_get_into(store_, c.data(), buffers.data(), sizes.data(),
                                               c.size(), out);
            });
    }
    /** Scatters each object over its buffers (sizes must sum to the object size). */
    std::vector<int> batch_get_into_multi_buffers(const std::vector<std::string> &keys,
                                                  const std::vector<std::vector<void *>> &all_buffers,
                                                  const std::vector<std::vector<size_t>> &all_sizes,
                                                  bool prefer_same_node = true) {
        (void)prefer_same_node;  // placement hint only; a single-node read path has no choice
        std::vector<const char *> c = detail::c_keys(keys);
        detail::Rows<void *> bufs(all_buffers);
        detail::Rows<size_t> sizes(all_sizes);
        return detail::to_int(detail::per_key<int64_t>(
            keys.size(), all_buffers.size() == keys.size() && detail::same_shape(all_buffers, all_sizes),
            [&](int64_t *out) {
                return mc_store_batch_get_into_multi_buffers(store_, c.data(), c.size(),
                                                             bufs.ptrs.data(), sizes.ptrs.data(),
                                                             bufs.counts.data(), out);
            }));
    }
    /** Reads the object into library memory; nullptr on any error (see last_error_message()). */
    std::shared_ptr<BufferHandle> get_buffer(const std::string &key) {
        mc_buffer_t *buffer = nullptr;
        if (mc_store_get_buffer(store_, key.c_str(), &buffer) < 0 || buffer == nullptr)
            return nullptr;
        return std::make_shared<BufferHandle>(buffer);
    }
    /** Per key: a handle, or nullptr on error. */
    std::vector<std::shared_ptr<BufferHandle>> batch_get_buffer(const std::vector<std::string> &keys) {
        std::vector<std::shared_ptr<BufferHandle>> handles(keys.size());
        if (keys.empty()) return handles;
        std::vector<const char *> c = detail::c_keys(keys);
        std::vector<mc_buffer_t *> out(keys.size(), nullptr);
        std::vector<int> results(keys.size(), kInvalidParams);
        if (mc_store_batch_get_buffer(store_, c.data(), c.size(), out.data(), results.data()) < 0)
            return handles;
        for (size_t i = 0; i < keys.size(); ++i)
            if (out[i] != nullptr) handles[i] = std::make_shared<BufferHandle>(out[i]);
        return handles;
    }

    /**
     * Buffer-major gather, Mooncake's shape: fragment (i, j, k) copies
     * `all_keys[i][j]` bytes `[src, src + size)` to `buffers[i] + dst`. Returns bytes (or an error)
     * per fragment. Each buffer's capacity comes from register_buffer (the region containing it);
     * an unregistered buffer gives -600 for its fragments, as in Mooncake.
     */
    std::vector<std::vector<std::vector<int64_t>>> get_into_ranges(
        const std::vector<void *> &buffers, const std::vector<std::vector<std::string>> &all_keys,
        const std::vector<std::vector<std::vector<uint64_t>>> &all_dst_offsets,
        const std::vector<std::vector<std::vector<uint64_t>>> &all_src_offsets,
        const std::vector<std::vector<std::vector<uint64_t>>> &all_sizes) {
        std::vector<size_t> capacities;
        capacities.reserve(buffers.size());
        for (void *buffer : buffers) capacities.push_back(registered_capacity(buffer));
        return get_into_ranges(buffers, capacities, all_keys, all_dst_offsets, all_src_offsets,
                               all_sizes);
    }
    /** get_into_ranges with explicit buffer capacities (no registration needed). */
    std::vector<std::vector<std::vector<int64_t>>> get_into_ranges(
        const std::vector<void *> &buffers, const std::vector<size_t> &buffer_sizes,
        const std::vector<std::vector<std::string>> &all_keys,
        const std::vector<std::vector<std::vector<uint64_t>>> &all_dst_offsets,
        const std::vector<std::vector<std::vector<uint64_t>>> &all_src_offsets,
        const std::vector<std::vector<std::vector<uint64_t>>> &all_sizes) {
        std::vector<std::vector<std::vector<int64_t>>> out(all_keys.size());
        std::vector<mc_range_t> ranges;
        std::vector<int64_t *> slots;
        for (size_t i = 0; i < all_keys.size(); ++i) {
            out[i].resize(all_keys[i].size());
            for (size_t j = 0; j < all_keys[i].size(); ++j) {
                bool ok = i < buffers.size() && i < all_dst_offsets.size() &&
                          i < all_src_offsets.size() && i < all_sizes.size() &&
                          j < all_dst_offsets[i].size() && j < all_src_offsets[i].size() &&
                          j < all_sizes[i].size() &&
                          all_dst_offsets[i][j].size() == all_sizes[i][j].size() &&
                          all_src_offsets[i][j].size() == all_sizes[i][j].size();
                size_t n = i < all_sizes.size() && j < all_sizes[i].size() ? all_sizes[i][j].size() : 0;
                out[i][j].assign(n, kInvalidParams);
                if (!ok) continue;
                for (size_t k = 0; k < n; ++k) {
                    ranges.push_back(mc_range_t{i, all_keys[i][j].c_str(), all_dst_offsets[i][j][k],
                                                all_src_offsets[i][j][k], all_sizes[i][j][k]});
                    slots.push_back(&out[i][j][k]);
                }
            }
        }
        if (ranges.empty() || buffer_sizes.size() != buffers.size()) return out;
        std::vector<int64_t> results(ranges.size(), kInvalidParams);
        int rc = mc_store_get_into_ranges(store_, buffers.data(), buffer_sizes.data(), buffers.size(),
                                          ranges.data(), ranges.size(), results.data());
        for (size_t r = 0; r < ranges.size(); ++r) *slots[r] = rc < 0 ? rc : results[r];
        return out;
    }

    // --- sessions: layer-wise ranged get and put ----------------------------------------------

    /** Starts get sessions (one lease each); per key 0 or an error. */
    std::vector<int> batch_get_session_start(const std::vector<std::string> &keys) {
        std::vector<const char *> c = detail::c_keys(keys);
        return detail::per_key<int>(keys.size(), true, [&](int *out) {
            return mc_store_batch_get_session_start(store_, c.data(), c.size(), out);
        });
    }
    /** For key i, buffer j receives object bytes [src_offsets[i][j], + sizes[i][j]). */
    std::vector<int> batch_get_into_multi_buffer_ranges(
        const std::vector<std::string> &keys, const std::vector<std::vector<void *>> &all_buffers,
        const std::vector<std::vector<size_t>> &all_sizes,
        const std::vector<std::vector<uint64_t>> &all_src_offsets) {
        std::vector<const char *> c = detail::c_keys(keys);
        detail::Rows<void *> bufs(all_buffers);
        detail::Rows<size_t> sizes(all_sizes);
        detail::Rows<uint64_t> offsets(all_src_offsets);
        bool ok = all_buffers.size() == keys.size() && detail::same_shape(all_buffers, all_sizes) &&
                  detail::same_shape(all_buffers, all_src_offsets);
        return detail::to_int(detail::per_key<int64_t>(keys.size(), ok, [&](int64_t *out) {
            return mc_store_batch_get_into_multi_buffer_ranges(
                store_, c.data(), c.size(), bufs.ptrs.data(), sizes.ptrs.data(),
                offsets.ptrs.data(), bufs.counts.data(), out);
        }));
    }
    /** Ends get sessions; always 0, idempotent. */
    int batch_get_session_end(const std::vector<std::string> &keys) {
        std::vector<const char *> c = detail::c_keys(keys);
        return mc_store_batch_get_session_end(store_, c.data(), c.size());
    }

    // --- on-stream gets and puts (seed: layer-wise KV load/save on the caller's stream) ----------
    //
    // `stream_kind` is MC_STREAM_HOST (`stream` = HostStream::get()), MC_STREAM_CUDA
    // (cudaStream_t) or MC_STREAM_ASCEND (aclrtStream); `stream` nullptr runs the blocking call
    // and returns a final ticket. Each returns {0, ticket} once the work is enqueued (per-key
    // outcomes in the ticket), or {code, empty ticket} when nothing was enqueued: -600 (bad
    // arguments; mismatched vector shapes or a rejected ReplicateConfig are refused here without
    // a call), -1012 (no runtime for the kind), -9001 TRY_AGAIN, -9002
    // STREAM_CAPTURE_UNSUPPORTED. Buffers must stay valid and untouched until the stream has
    // passed the call.

    /** batch_get_into on a stream: keys[i] into buffers[i] (capacity sizes[i]). */
    OnStreamResult batch_get_into_on_stream(const std::vector<std::string> &keys,
                                            const std::vector<void *> &buffers,
                                            const std::vector<size_t> &sizes,
                                            int32_t stream_kind, void *stream) {
        std::vector<const char *> c = detail::c_keys(keys);
        bool ok = buffers.size() == keys.size() && sizes.size() == keys.size();
        return on_stream(ok, [&](mc_ticket_t **ticket) {
            return mc_store_batch_get_into_on_stream(store_, c.data(), buffers.data(), sizes.data(),
                                                     c.size(), stream_kind, stream, ticket);
        });
    }
    /** batch_get_into_multi_buffers on a stream (each key's sizes add up to its object). */
    OnStreamResult batch_get_into_multi_buffers_on_stream(
        const std::vector<std::string> &keys, const std::vector<std::vector<void *>> &all_buffers,
        const std::vector<std::vector<size_t>> &all_sizes, int32_t stream_kind, void *stream) {
        std::vector<const char *> c = detail::c_keys(keys);
        detail::Rows<void *> bufs(all_buffers);
        detail::Rows<size_t> sizes(all_sizes);
        bool ok = all_buffers.size() == keys.size() && detail::same_shape(all_buffers, all_sizes);
        return on_stream(ok, [&](mc_ticket_t **ticket) {
            return mc_store_batch_get_into_multi_buffers_on_stream(
                store_, c.data(), c.size(), bufs.ptrs.data(), sizes.ptrs.data(),
                bufs.counts.data(), stream_kind, stream, ticket);
        });
    }
    /**
     * batch_get_into_multi_buffer_ranges on a stream, inside get sessions (no master call):
     * buffer j of key i receives object bytes [src_offsets[i][j], + sizes[i][j]).
     * (C: mc_store_get_into_ranges_on_stream.)
     */
    OnStreamResult batch_get_into_multi_buffer_ranges_on_stream(
        const std::vector<std::string> &keys, const std::vector<std::vector<void *>> &all_buffers,
        const std::vector<std::vector<size_t>> &all_sizes,
        const std::vector<std::vector<uint64_t>> &all_src_offsets, int32_t stream_kind,
        void *stream) {
        std::vector<const char *> c = detail::c_keys(keys);
        detail::Rows<void *> bufs(all_buffers);
        detail::Rows<size_t> sizes(all_sizes);
        detail::Rows<uint64_t> offsets(all_src_offsets);
        bool ok = all_buffers.size() == keys.size() && detail::same_shape(all_buffers, all_sizes) &&
                  detail::same_shape(all_buffers, all_src_offsets);
        return on_stream(ok, [&](mc_ticket_t **ticket) {
            return mc_store_get_into_ranges_on_stream(
                store_, c.data(), c.size(), bufs.ptrs.data(), sizes.ptrs.data(),
                offsets.ptrs.data(), bufs.counts.data(), stream_kind, stream, ticket);
        });
    }
    /**
     * batch_put_from ordered on a producer's stream: reserves the objects and returns; when the
     * stream reaches the call the sources are copied and the objects committed. The ticket turns
     * 0 only after the commit (a get before that sees the old state); per key it holds the bytes
     * written or the error. Sources must stay valid and unchanged until the stream passed the call.
     */
    OnStreamResult batch_put_from_on_stream(const std::vector<std::string> &keys,
                                            const std::vector<void *> &buffers,
                                            const std::vector<size_t> &sizes,
                                            const ReplicateConfig &config, int32_t stream_kind,
                                            void *stream) {
        std::vector<const char *> c = detail::c_keys(keys);
        detail::CConfig cfg(config);
        bool ok = buffers.size() == keys.size() && sizes.size() == keys.size() && !cfg.rejected();
        return on_stream(ok, [&](mc_ticket_t **ticket) {
            return mc_store_batch_put_from_on_stream(store_, c.data(), buffers.data(), sizes.data(),
                                                     c.size(), cfg.get(), stream_kind, stream,
                                                     ticket);
        });
    }
    /** batch_put_from_multi_buffers ordered on a stream (each object the concatenation of its
     *  buffers); as batch_put_from_on_stream. */
    OnStreamResult batch_put_from_multi_buffers_on_stream(
        const std::vector<std::string> &keys, const std::vector<std::vector<void *>> &all_buffers,
        const std::vector<std::vector<size_t>> &all_sizes, const ReplicateConfig &config,
        int32_t stream_kind, void *stream) {
        std::vector<const char *> c = detail::c_keys(keys);
        detail::Rows<void *> bufs(all_buffers);
        detail::Rows<size_t> sizes(all_sizes);
        detail::CConfig cfg(config);
        bool ok = all_buffers.size() == keys.size() &&
                  detail::same_shape(all_buffers, all_sizes) && !cfg.rejected();
        return on_stream(ok, [&](mc_ticket_t **ticket) {
            return mc_store_batch_put_from_multi_buffers_on_stream(
                store_, c.data(), c.size(), bufs.ptrs.data(), sizes.ptrs.data(),
                bufs.counts.data(), cfg.get(), stream_kind, stream, ticket);
        });
    }
    /** Reserves objects of `sizes` bytes for ranged writes; per key 0 or an error (-705 exists). */
    std::vector<int> batch_put_session_start(const std::vector<std::string> &keys,
                                             const std::vector<uint64_t> &sizes,
                                             const ReplicateConfig &config = {}) {
        std::vector<const char *> c = detail::c_keys(keys);
        detail::CConfig cfg(config);
        return detail::per_key<int>(keys.size(), sizes.size() == keys.size() && !cfg.rejected(),
                                    [&](int *out) {
                                        return mc_store_batch_put_session_start(
                                            store_, c.data(), sizes.data(), c.size(), cfg.get(), out);
                                    });
    }
    /** Writes buffer j of key i at object offset dst_offsets[i][j]; per key bytes or an error. */
    std::vector<int> batch_put_from_multi_buffer_ranges(
        const std::vector<std::string> &keys, const std::vector<std::vector<void *>> &all_buffers,
        const std::vector<std::vector<size_t>> &all_sizes,
        const std::vector<std::vector<uint64_t>> &all_dst_offsets) {
        std::vector<const char *> c = detail::c_keys(keys);
        detail::Rows<void *> bufs(all_buffers);
        detail::Rows<size_t> sizes(all_sizes);
        detail::Rows<uint64_t> offsets(all_dst_offsets);
        bool ok = all_buffers.size() == keys.size() && detail::same_shape(all_buffers, all_sizes) &&
                  detail::same_shape(all_buffers, all_dst_offsets);
        return detail::to_int(detail::per_key<int64_t>(keys.size(), ok, [&](int64_t *out) {
            return mc_store_batch_put_from_multi_buffer_ranges(
                store_, c.data(), c.size(), bufs.ptrs.data(), sizes.ptrs.data(), offsets.ptrs.data(), bufs.counts.data(), out);
        }));
    }
    /** Seals and commits put sessions; per key 0 or an error (the session is kept on error). */
    std::vector<int> batch_put_session_end(const std::vector<std::string> &keys) {
        return session_call(keys, &mc_store_batch_put_session_end);
    }
    /** Seals and revokes put sessions; per key 0 or an error. */
    std::vector<int> batch_put_session_revoke(const std::vector<std::string> &keys) {
        return session_call(keys, &mc_store_batch_put_session_revoke);
    }

    // --- existence, size, remove --------------------------------------------------------------

    /** 1 exists, 0 missing, negative on error. Grants a read lease. */
    int isExist(const std::string &key) { return mc_store_is_exist(store_, key.c_str()); }
    /** isExist per key. */
    std::vector<int> batchIsExist(const std::vector<std::string> &keys) {
        std::vector<const char *> c = detail::c_keys(keys);
        return detail::per_key<int>(keys.size(), true, [&](int *out) {
            return mc_store_batch_is_exist(store_, c.data(), c.size(), out);
        });
    }
    /** Object size, or -704 when missing. Grants a read lease. */
    int64_t getSize(const std::string &key) { return mc_store_get_size(store_, key.c_str()); }
    /** 0, -704 missing, -706 leased (unless force), -703 still being written. */
    int remove(const std::string &key, bool force = false) {
        return mc_store_remove(store_, key.c_str(), force ? 1 : 0);
    }
    /** remove per key (a repeated key gives -704 after the first). */
    std::vector<int> batchRemove(const std::vector<std::string> &keys, bool force = false) {
        std::vector<const char *> c = detail::c_keys(keys);
        return detail::per_key<int>(keys.size(), true, [&](int *out) {
            return mc_store_batch_remove(store_, c.data(), c.size(), force ? 1 : 0, out);
        });
    }
    /** Removes objects whose key matches `pattern` (ECMAScript, substring search); the count. */
    long removeByRegex(const std::string &pattern, bool force = false) {
        return static_cast<long>(mc_store_remove_by_regex(store_, pattern.c_str(), force ? 1 : 0));
    }
    /** Removes every complete, unleased (unless force) object; the count. */
    long removeAll(bool force = false) {
        return static_cast<long>(mc_store_remove_all(store_, force ? 1 : 0));
    }

private:
    template <class Call>
    int single(const ReplicateConfig &config, Call call) {
        detail::CConfig cfg(config);
        return cfg.rejected() ? kInvalidParams : call(cfg.get());
    }

    using PartsFn = int (*)(mc_store_t *, const char *, const void *const *, const size_t *, size_t,
                            const mc_replicate_config_t *);
    template <class Bytes>
    int parts(const std::string &key, const std::vector<Bytes> &values,
              const ReplicateConfig &config, PartsFn fn) {
        static_assert(detail::is_bytes<Bytes>::value, "parts must expose data() and size() bytes");
        std::vector<const void *> ptrs;
        std::vector<size_t> sizes;
        for (const Bytes &value : values) {
            ptrs.push_back(value.data());
            sizes.push_back(value.size());
        }
        return single(config, [&](const mc_replicate_config_t *c) {
            return fn(store_, key.c_str(), ptrs.data(), sizes.data(), ptrs.size(), c);
        });
    }

    using BatchCopyFn = int (*)(mc_store_t *, const char *const *, const void *const *,
                                const size_t *, size_t, const mc_replicate_config_t *);
    template <class Bytes>
    int batch_copy(const std::vector<std::string> &keys, const std::vector<Bytes> &values,
                   const ReplicateConfig &config, BatchCopyFn fn) {
        static_assert(detail::is_bytes<Bytes>::value, "values must expose data() and size() bytes");
        if (keys.size() != values.size()) return kInvalidParams;
        std::vector<const char *> c = detail::c_keys(keys);
        std::vector<const void *> ptrs;
        std::vector<size_t> sizes;
        for (const Bytes &value : values) {
            ptrs.push_back(value.data());
            sizes.push_back(value.size());
        }
        return single(config, [&](const mc_replicate_config_t *cfg) {
            return fn(store_, c.data(), ptrs.data(), sizes.data(), c.size(), cfg);
        });
    }

    using BatchFromFn = int (*)(mc_store_t *, const char *const *, const void *const *,
                                const size_t *, size_t, const mc_replicate_config_t *, int *);
    std::vector<int> batch_from(const std::vector<std::string> &keys,
                                const std::vector<void *> &buffers, const std::vector<size_t> &sizes,
                                const ReplicateConfig &config, BatchFromFn fn) {
        std::vector<const char *> c = detail::c_keys(keys);
        detail::CConfig cfg(config);
        bool ok = buffers.size() == keys.size() && sizes.size() == keys.size() && !cfg.rejected();
        return detail::per_key<int>(keys.size(), ok, [&](int *out) {
            return fn(store_, c.data(), buffers.data(), sizes.data(), c.size(), cfg.get(), out);
        });
    }

    using BatchMultiFn = int (*)(mc_store_t *, const char *const *, size_t,
                                 const void *const *const *, const size_t *const *, const size_t *,
                                 const mc_replicate_config_t *, int *);
    std::vector<int> batch_multi(const std::vector<std::string> &keys,
                                 const std::vector<std::vector<void *>> &all_buffers,
                                 const std::vector<std::vector<size_t>> &all_sizes,
                                 const ReplicateConfig &config, BatchMultiFn fn) {
        std::vector<const char *> c = detail::c_keys(keys);
        detail::Rows<void *> bufs(all_buffers);
        detail::Rows<size_t> sizes(all_sizes);
        detail::CConfig cfg(config);
        bool ok = all_buffers.size() == keys.size() &&
                  detail::same_shape(all_buffers, all_sizes) && !cfg.rejected();
        return detail::per_key<int>(keys.size(), ok, [&](int *out) {
            return fn(store_, c.data(), c.size(), bufs.ptrs.data(), sizes.ptrs.data(),
                      bufs.counts.data(), cfg.get(), out);
        });
    }

    template <class Call>
    static OnStreamResult on_stream(bool shapes_ok, Call call) {
        if (!shapes_ok) return {kInvalidParams, Ticket()};
        mc_ticket_t *ticket = nullptr;
        int rc = call(&ticket);  // the C call leaves `ticket` NULL unless it returns 0
        return {rc, Ticket(ticket)};
    }

    using SessionFn = int (*)(mc_store_t *, const char *const *, size_t, int *);
    std::vector<int> session_call(const std::vector<std::string> &keys, SessionFn fn) {
        std::vector<const char *> c = detail::c_keys(keys);
        return detail::per_key<int>(keys.size(), true,
                                    [&](int *out) { return fn(store_, c.data(), c.size(), out); });
    }

    size_t registered_capacity(void *buffer) {
        uintptr_t addr = reinterpret_cast<uintptr_t>(buffer);
        std::lock_guard<std::mutex> lock(regions_mutex_);
        auto it = regions_.upper_bound(addr);
        if (it == regions_.begin()) return 0;
        --it;
        return addr < it->first + it->second ? it->first + it->second - addr : 0;
    }

    mc_store_t *store_;
    std::mutex regions_mutex_;
    std::map<uintptr_t, size_t> regions_;  // register_buffer regions: base -> size
};

}  // namespace mooncake_rs

#endif  // MOONCAKE_RS_HPP
