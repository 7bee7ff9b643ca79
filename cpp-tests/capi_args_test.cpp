// Bad arguments to every mc_* function: each call returns an error code (never crashes) and
// leaves a non-empty message in mc_last_error_message; the handle keeps working afterwards.
// Functions without an error code in their return type (mc_ticket_key_count,
// mc_ticket_status_word) give 0 / NULL and the message.
#include "support.hpp"

#include <cstring>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

namespace {

constexpr int64_t kInvalid = test::kInvalidParams;
constexpr int kN = 2;  // batch size used by the batch cases

/** The code a batch call reports: its return value, or the common per-key code when all agree. */
template <class T>
int64_t batch_code(int rc, const T *results, size_t n) {
    if (rc < 0) return rc;
    for (size_t i = 1; i < n; ++i)
        if (results[i] != results[0]) return 0;
    return n > 0 ? results[0] : rc;
}

/** One shared, set-up embedded store (set-up once; checked after each case) and one host
 *  stream for the whole suite. */
class ArgsEnv {
public:
    static mc_store_t *store() { return env().store_; }
    static mc_host_stream_t *stream() { return env().stream_; }

private:
    static ArgsEnv &env() {
        static ArgsEnv env;
        return env;
    }
    ArgsEnv() : store_(mc_store_new()), stream_(mc_host_stream_new()) {
        mc_setup_config_t config;
        mc_setup_config_init(&config);
        config.master_server_addr = "embedded";
        if (mc_store_setup(store_, &config) != 0 ||
            mc_store_put(store_, "args/known", "v", 1, nullptr) != 0) {
            mc_store_free(store_);
            store_ = nullptr;
        }
    }
    ~ArgsEnv() {
        mc_host_stream_free(stream_);
        mc_store_free(store_);
    }
    mc_store_t *store_;
    mc_host_stream_t *stream_;
};

struct Case {
    const char *name;
    std::function<int64_t(mc_store_t *)> call;
    int64_t expected = kInvalid;
};

// Valid building blocks the cases spoil one argument at a time.
char g_buf[64];
void *g_bufs[kN] = {g_buf, g_buf};
const void *g_cbufs[kN] = {g_buf, g_buf};
size_t g_sizes[kN] = {8, 8};
uint64_t g_u64[kN] = {0, 0};
size_t g_counts[kN] = {1, 1};
const char *g_keys[kN] = {"args/a", "args/b"};
const char *g_null_key[kN] = {"args/a", nullptr};
const char *g_bad_utf8[kN] = {"args/\xff\xfe", "args/b"};
void *const *g_rows[kN] = {g_bufs, g_bufs};
const void *const *g_crows[kN] = {g_cbufs, g_cbufs};
const size_t *g_size_rows[kN] = {g_sizes, g_sizes};
const uint64_t *g_off_rows[kN] = {g_u64, g_u64};
int g_ires[kN];
int64_t g_lres[kN];

mc_replicate_config_t config_with(const std::function<void(mc_replicate_config_t &)> &edit) {
    mc_replicate_config_t c;
    mc_replicate_config_init(&c);
    edit(c);
    return c;
}

int64_t put_with(mc_store_t *s, const std::function<void(mc_replicate_config_t &)> &edit) {
    mc_replicate_config_t c = config_with(edit);
    return mc_store_put(s, "args/cfg", g_buf, 8, &c);
}

// On-stream building blocks: one key ("args/known") read into g_buf on the suite's host stream.
const char *g_known[1] = {"args/known"};
void *g_out[1] = {g_buf};
size_t g_out_size[1] = {8};
void *const *g_out_rows[1] = {g_out};
const size_t *g_out_size_rows[1] = {g_out_size};
const uint64_t *g_zero_rows[1] = {g_u64};
size_t g_one[1] = {1};
void *host() { return ArgsEnv::stream(); }

/** An on-stream call's code; the ticket out-pointer must come back NULL on failure (else 1). */
int64_t on_stream(const std::function<int(mc_ticket_t **)> &call) {
    mc_ticket_t *ticket = reinterpret_cast<mc_ticket_t *>(g_buf);
    int rc = call(&ticket);
    if (rc == 0) mc_ticket_free(ticket);
    return ticket == nullptr || rc == 0 ? rc : 1;
}

/** Runs `f` on a final ticket (a blocking get of one key) and frees it; 1 if none was made. */
int64_t with_ticket(mc_store_t *s, const std::function<int64_t(mc_ticket_t *)> &f) {
    mc_ticket_t *ticket = nullptr;
    if (mc_store_batch_get_into_on_stream(s, g_known, g_out, g_out_size, 1, MC_STREAM_HOST, nullptr,
                                          &ticket) != 0)
        return 1;
    int64_t rc = f(ticket);
    mc_ticket_free(ticket);
    return rc;
}

/** Runs `f` on a fresh host event and frees it. */
int64_t with_event(const std::function<int64_t(mc_host_event_t *)> &f) {
    mc_host_event_t *event = mc_host_event_new();
    int64_t rc = event == nullptr ? 1 : f(event);
    mc_host_event_free(event);
    return rc;
}

const void *g_src[1] = {g_buf};
const void *const *g_src_rows[1] = {g_src};
const char *g_dup_keys[kN] = {"args/dup", "args/dup"};

int64_t put_on(mc_store_t *s, const char *const *keys, const void *const *bufs, const size_t *sizes,
               size_t count, const mc_replicate_config_t *cfg, int32_t kind) {
    return on_stream([&](mc_ticket_t **t) {
        return mc_store_batch_put_from_on_stream(s, keys, bufs, sizes, count, cfg, kind, host(), t);
    });
}
int64_t put_multi_on(mc_store_t *s, const void *const *const *bufs, const size_t *counts,
                     int32_t kind) {
    return on_stream([&](mc_ticket_t **t) {
        return mc_store_batch_put_from_multi_buffers_on_stream(s, g_known, 1, bufs, g_out_size_rows,
                                                               counts, nullptr, kind, host(), t);
    });
}

int64_t get_on(mc_store_t *s, const char *const *keys, void *const *bufs, const size_t *sizes,
               size_t count, int32_t kind, void *stream) {
    return on_stream([&](mc_ticket_t **t) {
        return mc_store_batch_get_into_on_stream(s, keys, bufs, sizes, count, kind, stream, t);
    });
}
int64_t multi_on(mc_store_t *s, const char *const *keys, void *const *const *bufs,
                 const size_t *const *sizes, const size_t *counts, int32_t kind) {
    return on_stream([&](mc_ticket_t **t) {
        return mc_store_batch_get_into_multi_buffers_on_stream(s, keys, 1, bufs, sizes, counts, kind,
                                                               host(), t);
    });
}
int64_t ranges_on(mc_store_t *s, const char *const *keys, void *const *const *bufs,
                  const size_t *const *sizes, const uint64_t *const *offsets, const size_t *counts,
                  int32_t kind) {
    return on_stream([&](mc_ticket_t **t) {
        return mc_store_get_into_ranges_on_stream(s, keys, 1, bufs, sizes, offsets, counts, kind,
                                                  host(), t);
    });
}

const std::vector<Case> &cases() {
    static const std::vector<Case> all = {
        // lifecycle
        {"setup_null_store", [](mc_store_t *) { mc_setup_config_t c; mc_setup_config_init(&c); return (int64_t)mc_store_setup(nullptr, &c); }},
        {"setup_null_config", [](mc_store_t *) { mc_store_t *s = mc_store_new(); int64_t rc = mc_store_setup(s, nullptr); mc_store_free(s); return rc; }},
        {"setup_null_hostname", [](mc_store_t *) { mc_store_t *s = mc_store_new(); mc_setup_config_t c; mc_setup_config_init(&c); c.local_hostname = nullptr; c.master_server_addr = "embedded"; int64_t rc = mc_store_setup(s, &c); mc_store_free(s); return rc; }},
        {"setup_twice", [](mc_store_t *s) { mc_setup_config_t c; mc_setup_config_init(&c); c.master_server_addr = "embedded"; return (int64_t)mc_store_setup(s, &c); }},
        {"init_all_null_store", [](mc_store_t *) { return (int64_t)mc_store_init_all(nullptr, "tcp", "", 1 << 20); }},
        {"teardown_null_store", [](mc_store_t *) { return (int64_t)mc_store_teardown(nullptr); }},
        {"health_check_null_store", [](mc_store_t *) { return (int64_t)mc_store_health_check(nullptr); }},
        {"get_hostname_null_store", [](mc_store_t *) { return (int64_t)mc_store_get_hostname(nullptr, g_buf, sizeof g_buf); }},
        {"get_hostname_null_buf", [](mc_store_t *s) { return (int64_t)mc_store_get_hostname(s, nullptr, 64); }},
        {"get_hostname_too_small", [](mc_store_t *s) { return (int64_t)mc_store_get_hostname(s, g_buf, 2); }},
        {"register_null_store", [](mc_store_t *) { return (int64_t)mc_store_register_buffer(nullptr, g_buf, 8); }},
        {"register_null_buf", [](mc_store_t *s) { return (int64_t)mc_store_register_buffer(s, nullptr, 8); }},
        {"register_zero_size", [](mc_store_t *s) { return (int64_t)mc_store_register_buffer(s, g_buf, 0); }},
        {"unregister_null_store", [](mc_store_t *) { return (int64_t)mc_store_unregister_buffer(nullptr, g_buf); }},
        {"unregister_null_buf", [](mc_store_t *s) { return (int64_t)mc_store_unregister_buffer(s, nullptr); }},
        {"unregister_unknown", [](mc_store_t *s) { return (int64_t)mc_store_unregister_buffer(s, g_buf + 3); }},
        // put family
        {"put_null_store", [](mc_store_t *) { return (int64_t)mc_store_put(nullptr, "k", g_buf, 8, nullptr); }},
        {"put_null_key", [](mc_store_t *s) { return (int64_t)mc_store_put(s, nullptr, g_buf, 8, nullptr); }},
        {"put_null_value", [](mc_store_t *s) { return (int64_t)mc_store_put(s, "args/k", nullptr, 8, nullptr); }},
        {"put_non_utf8_key", [](mc_store_t *s) { return (int64_t)mc_store_put(s, g_bad_utf8[0], g_buf, 8, nullptr); }},
        {"put_empty_key", [](mc_store_t *s) { return (int64_t)mc_store_put(s, "", g_buf, 8, nullptr); }},
        {"put_bad_soft_pin_enum", [](mc_store_t *s) { return put_with(s, [](mc_replicate_config_t &c) { c.soft_pin_action = 7; }); }},
        {"put_negative_soft_pin_enum", [](mc_store_t *s) { return put_with(s, [](mc_replicate_config_t &c) { c.soft_pin_action = -1; }); }},
        {"put_zero_replicas", [](mc_store_t *s) { return put_with(s, [](mc_replicate_config_t &c) { c.replica_num = 0; }); }},
        {"put_null_preferred_segments", [](mc_store_t *s) { return put_with(s, [](mc_replicate_config_t &c) { c.preferred_segments_count = 3; }); }},
        {"put_from_null_store", [](mc_store_t *) { return (int64_t)mc_store_put_from(nullptr, "k", g_buf, 8, nullptr); }},
        {"put_from_null_key", [](mc_store_t *s) { return (int64_t)mc_store_put_from(s, nullptr, g_buf, 8, nullptr); }},
        {"put_from_null_buf", [](mc_store_t *s) { return (int64_t)mc_store_put_from(s, "args/k", nullptr, 8, nullptr); }},
        {"put_parts_null_parts", [](mc_store_t *s) { return (int64_t)mc_store_put_parts(s, "args/k", nullptr, g_sizes, kN, nullptr); }},
        {"put_parts_null_sizes", [](mc_store_t *s) { return (int64_t)mc_store_put_parts(s, "args/k", g_cbufs, nullptr, kN, nullptr); }},
        {"put_parts_null_part", [](mc_store_t *s) { const void *p[kN] = {g_buf, nullptr}; return (int64_t)mc_store_put_parts(s, "args/k", p, g_sizes, kN, nullptr); }},
        {"put_batch_null_keys", [](mc_store_t *s) { return (int64_t)mc_store_put_batch(s, nullptr, g_cbufs, g_sizes, kN, nullptr); }},
        {"put_batch_null_key_entry", [](mc_store_t *s) { return (int64_t)mc_store_put_batch(s, g_null_key, g_cbufs, g_sizes, kN, nullptr); }},
        {"put_batch_null_values", [](mc_store_t *s) { return (int64_t)mc_store_put_batch(s, g_keys, nullptr, g_sizes, kN, nullptr); }},
        {"batch_put_from_null_results", [](mc_store_t *s) { return (int64_t)mc_store_batch_put_from(s, g_keys, g_cbufs, g_sizes, kN, nullptr, nullptr); }},
        {"batch_put_from_null_keys", [](mc_store_t *s) { return batch_code(mc_store_batch_put_from(s, nullptr, g_cbufs, g_sizes, kN, nullptr, g_ires), g_ires, kN); }},
        {"batch_put_from_null_sizes", [](mc_store_t *s) { return batch_code(mc_store_batch_put_from(s, g_keys, g_cbufs, nullptr, kN, nullptr, g_ires), g_ires, kN); }},
        {"batch_put_from_bad_enum", [](mc_store_t *s) { mc_replicate_config_t c = config_with([](mc_replicate_config_t &x) { x.soft_pin_action = 3; }); return batch_code(mc_store_batch_put_from(s, g_keys, g_cbufs, g_sizes, kN, &c, g_ires), g_ires, kN); }},
        {"batch_put_multi_null_counts", [](mc_store_t *s) { return batch_code(mc_store_batch_put_from_multi_buffers(s, g_keys, kN, g_crows, g_size_rows, nullptr, nullptr, g_ires), g_ires, kN); }},
        {"batch_put_multi_null_rows", [](mc_store_t *s) { return batch_code(mc_store_batch_put_from_multi_buffers(s, g_keys, kN, nullptr, g_size_rows, g_counts, nullptr, g_ires), g_ires, kN); }},
        // upsert family
        {"upsert_null_key", [](mc_store_t *s) { return (int64_t)mc_store_upsert(s, nullptr, g_buf, 8, nullptr); }},
        {"upsert_null_value", [](mc_store_t *s) { return (int64_t)mc_store_upsert(s, "args/k", nullptr, 8, nullptr); }},
        {"upsert_from_null_store", [](mc_store_t *) { return (int64_t)mc_store_upsert_from(nullptr, "k", g_buf, 8, nullptr); }},
        {"upsert_parts_null_sizes", [](mc_store_t *s) { return (int64_t)mc_store_upsert_parts(s, "args/k", g_cbufs, nullptr, kN, nullptr); }},
        {"upsert_batch_null_sizes", [](mc_store_t *s) { return (int64_t)mc_store_upsert_batch(s, g_keys, g_cbufs, nullptr, kN, nullptr); }},
        {"batch_upsert_from_null_results", [](mc_store_t *s) { return (int64_t)mc_store_batch_upsert_from(s, g_keys, g_cbufs, g_sizes, kN, nullptr, nullptr); }},
        {"batch_upsert_multi_null_sizes", [](mc_store_t *s) { return batch_code(mc_store_batch_upsert_from_multi_buffers(s, g_keys, kN, g_crows, nullptr, g_counts, nullptr, g_ires), g_ires, kN); }},
        // get family
        {"get_into_null_store", [](mc_store_t *) { return mc_store_get_into(nullptr, "k", g_buf, 8); }},
        {"get_into_null_key", [](mc_store_t *s) { return mc_store_get_into(s, nullptr, g_buf, 8); }},
        {"get_into_null_buf", [](mc_store_t *s) { return mc_store_get_into(s, "args/known", nullptr, 8); }},
        {"batch_get_into_null_results", [](mc_store_t *s) { return (int64_t)mc_store_batch_get_into(s, g_keys, g_bufs, g_sizes, kN, nullptr); }},
        {"batch_get_into_null_bufs", [](mc_store_t *s) { return batch_code(mc_store_batch_get_into(s, g_keys, nullptr, g_sizes, kN, g_lres), g_lres, kN); }},
        {"batch_get_into_null_key_entry", [](mc_store_t *s) { return batch_code(mc_store_batch_get_into(s, g_null_key, g_bufs, g_sizes, kN, g_lres), g_lres, kN); }},
        {"batch_get_multi_null_counts", [](mc_store_t *s) { return batch_code(mc_store_batch_get_into_multi_buffers(s, g_keys, kN, g_rows, g_size_rows, nullptr, g_lres), g_lres, kN); }},
        {"ranges_null_buffers", [](mc_store_t *s) { mc_range_t r{0, "args/known", 0, 0, 1}; return batch_code(mc_store_get_into_ranges(s, nullptr, g_sizes, 1, &r, 1, g_lres), g_lres, 1); }},
        {"ranges_null_ranges", [](mc_store_t *s) { return batch_code(mc_store_get_into_ranges(s, g_bufs, g_sizes, 1, nullptr, 1, g_lres), g_lres, 1); }},
        {"ranges_null_results", [](mc_store_t *s) { mc_range_t r{0, "args/known", 0, 0, 1}; return (int64_t)mc_store_get_into_ranges(s, g_bufs, g_sizes, 1, &r, 1, nullptr); }},
        {"ranges_buffer_index_out_of_range", [](mc_store_t *s) { mc_range_t r{5, "args/known", 0, 0, 1}; return batch_code(mc_store_get_into_ranges(s, g_bufs, g_sizes, 1, &r, 1, g_lres), g_lres, 1); }},
        {"ranges_dst_overflow", [](mc_store_t *s) { mc_range_t r{0, "args/known", UINT64_MAX, 0, 1}; return batch_code(mc_store_get_into_ranges(s, g_bufs, g_sizes, 1, &r, 1, g_lres), g_lres, 1); }},
        {"get_buffer_null_out", [](mc_store_t *s) { return (int64_t)mc_store_get_buffer(s, "args/known", nullptr); }},
        {"get_buffer_null_key", [](mc_store_t *s) { mc_buffer_t *b = nullptr; int64_t rc = mc_store_get_buffer(s, nullptr, &b); mc_buffer_free(b); return rc; }},
        {"batch_get_buffer_null_out", [](mc_store_t *s) { return batch_code(mc_store_batch_get_buffer(s, g_keys, kN, nullptr, g_ires), g_ires, kN); }},
        {"batch_get_buffer_null_results", [](mc_store_t *s) { mc_buffer_t *b[kN] = {}; return (int64_t)mc_store_batch_get_buffer(s, g_keys, kN, b, nullptr); }},
        // sessions
        {"get_session_start_null_keys", [](mc_store_t *s) { return batch_code(mc_store_batch_get_session_start(s, nullptr, kN, g_ires), g_ires, kN); }},
        {"get_session_start_null_results", [](mc_store_t *s) { return (int64_t)mc_store_batch_get_session_start(s, g_keys, kN, nullptr); }},
        {"get_ranges_null_offsets", [](mc_store_t *s) { return batch_code(mc_store_batch_get_into_multi_buffer_ranges(s, g_keys, kN, g_rows, g_size_rows, nullptr, g_counts, g_lres), g_lres, kN); }},
        {"get_session_end_null_keys", [](mc_store_t *s) { return (int64_t)mc_store_batch_get_session_end(s, nullptr, kN); }},
        {"put_session_start_null_sizes", [](mc_store_t *s) { return batch_code(mc_store_batch_put_session_start(s, g_keys, nullptr, kN, nullptr, g_ires), g_ires, kN); }},
        {"put_session_start_bad_enum", [](mc_store_t *s) { mc_replicate_config_t c = config_with([](mc_replicate_config_t &x) { x.soft_pin_action = 9; }); return batch_code(mc_store_batch_put_session_start(s, g_keys, g_u64, kN, &c, g_ires), g_ires, kN); }},
        {"put_ranges_null_counts", [](mc_store_t *s) { return batch_code(mc_store_batch_put_from_multi_buffer_ranges(s, g_keys, kN, g_crows, g_size_rows, g_off_rows, nullptr, g_lres), g_lres, kN); }},
        {"put_session_end_null_results", [](mc_store_t *s) { return (int64_t)mc_store_batch_put_session_end(s, g_keys, kN, nullptr); }},
        {"put_session_revoke_null_keys", [](mc_store_t *s) { return batch_code(mc_store_batch_put_session_revoke(s, nullptr, kN, g_ires), g_ires, kN); }},
        // existence, size, remove, metrics
        {"is_exist_null_key", [](mc_store_t *s) { return (int64_t)mc_store_is_exist(s, nullptr); }},
        {"is_exist_null_store", [](mc_store_t *) { return (int64_t)mc_store_is_exist(nullptr, "k"); }},
        {"batch_is_exist_null_results", [](mc_store_t *s) { return (int64_t)mc_store_batch_is_exist(s, g_keys, kN, nullptr); }},
        {"batch_is_exist_bad_utf8", [](mc_store_t *s) { return batch_code(mc_store_batch_is_exist(s, g_bad_utf8, kN, g_ires), g_ires, 1); }},
        {"get_size_null_key", [](mc_store_t *s) { return mc_store_get_size(s, nullptr); }},
        {"remove_null_key", [](mc_store_t *s) { return (int64_t)mc_store_remove(s, nullptr, 0); }},
        {"batch_remove_null_results", [](mc_store_t *s) { return (int64_t)mc_store_batch_remove(s, g_keys, kN, 0, nullptr); }},
        {"remove_by_regex_null_pattern", [](mc_store_t *s) { return mc_store_remove_by_regex(s, nullptr, 0); }},
        {"remove_by_regex_invalid", [](mc_store_t *s) { return mc_store_remove_by_regex(s, "([", 0); }},
        {"remove_all_null_store", [](mc_store_t *) { return mc_store_remove_all(nullptr, 0); }},
        {"metrics_null_store", [](mc_store_t *) { size_t n = 0; return (int64_t)mc_store_metrics_json(nullptr, g_buf, sizeof g_buf, &n); }},
        {"metrics_too_small", [](mc_store_t *s) { size_t n = 0; int64_t rc = mc_store_metrics_json(s, g_buf, 1, &n); return n > 1 ? rc : 0; }},
        // on-stream gets (the ticket out-pointer is reset to NULL on every failure)
        {"get_on_stream_null_store", [](mc_store_t *) { return get_on(nullptr, g_known, g_out, g_out_size, 1, MC_STREAM_HOST, host()); }},
        {"get_on_stream_null_keys", [](mc_store_t *s) { return get_on(s, nullptr, g_out, g_out_size, 1, MC_STREAM_HOST, host()); }},
        {"get_on_stream_null_key_entry", [](mc_store_t *s) { return get_on(s, g_null_key, g_bufs, g_sizes, kN, MC_STREAM_HOST, host()); }},
        {"get_on_stream_non_utf8_key", [](mc_store_t *s) { return get_on(s, g_bad_utf8, g_out, g_out_size, 1, MC_STREAM_HOST, host()); }},
        {"get_on_stream_null_bufs", [](mc_store_t *s) { return get_on(s, g_known, nullptr, g_out_size, 1, MC_STREAM_HOST, host()); }},
        {"get_on_stream_null_sizes", [](mc_store_t *s) { return get_on(s, g_known, g_out, nullptr, 1, MC_STREAM_HOST, host()); }},
        {"get_on_stream_overlapping_bufs", [](mc_store_t *s) { return get_on(s, g_keys, g_bufs, g_sizes, kN, MC_STREAM_HOST, host()); }},
        {"get_on_stream_unknown_kind", [](mc_store_t *s) { return get_on(s, g_known, g_out, g_out_size, 1, 3, host()); }},
        {"get_on_stream_negative_kind", [](mc_store_t *s) { return get_on(s, g_known, g_out, g_out_size, 1, -1, host()); }},
        {"get_on_stream_unknown_kind_null_stream", [](mc_store_t *s) { return get_on(s, g_known, g_out, g_out_size, 1, 7, nullptr); }},
        {"get_on_stream_null_ticket_out", [](mc_store_t *s) { return (int64_t)mc_store_batch_get_into_on_stream(s, g_known, g_out, g_out_size, 1, MC_STREAM_HOST, host(), nullptr); }},
        {"multi_on_stream_null_store", [](mc_store_t *) { return multi_on(nullptr, g_known, g_out_rows, g_out_size_rows, g_one, MC_STREAM_HOST); }},
        {"multi_on_stream_null_keys", [](mc_store_t *s) { return multi_on(s, nullptr, g_out_rows, g_out_size_rows, g_one, MC_STREAM_HOST); }},
        {"multi_on_stream_null_bufs", [](mc_store_t *s) { return multi_on(s, g_known, nullptr, g_out_size_rows, g_one, MC_STREAM_HOST); }},
        {"multi_on_stream_null_sizes", [](mc_store_t *s) { return multi_on(s, g_known, g_out_rows, nullptr, g_one, MC_STREAM_HOST); }},
        {"multi_on_stream_null_buf_counts", [](mc_store_t *s) { return multi_on(s, g_known, g_out_rows, g_out_size_rows, nullptr, MC_STREAM_HOST); }},
        {"multi_on_stream_unknown_kind", [](mc_store_t *s) { return multi_on(s, g_known, g_out_rows, g_out_size_rows, g_one, 3); }},
        {"multi_on_stream_null_ticket_out", [](mc_store_t *s) { return (int64_t)mc_store_batch_get_into_multi_buffers_on_stream(s, g_known, 1, g_out_rows, g_out_size_rows, g_one, MC_STREAM_HOST, host(), nullptr); }},
        {"ranges_on_stream_null_store", [](mc_store_t *) { return ranges_on(nullptr, g_known, g_out_rows, g_out_size_rows, g_zero_rows, g_one, MC_STREAM_HOST); }},
        {"ranges_on_stream_null_keys", [](mc_store_t *s) { return ranges_on(s, nullptr, g_out_rows, g_out_size_rows, g_zero_rows, g_one, MC_STREAM_HOST); }},
        {"ranges_on_stream_null_bufs", [](mc_store_t *s) { return ranges_on(s, g_known, nullptr, g_out_size_rows, g_zero_rows, g_one, MC_STREAM_HOST); }},
        {"ranges_on_stream_null_sizes", [](mc_store_t *s) { return ranges_on(s, g_known, g_out_rows, nullptr, g_zero_rows, g_one, MC_STREAM_HOST); }},
        {"ranges_on_stream_null_src_offsets", [](mc_store_t *s) { return ranges_on(s, g_known, g_out_rows, g_out_size_rows, nullptr, g_one, MC_STREAM_HOST); }},
        {"ranges_on_stream_null_buf_counts", [](mc_store_t *s) { return ranges_on(s, g_known, g_out_rows, g_out_size_rows, g_zero_rows, nullptr, MC_STREAM_HOST); }},
        {"ranges_on_stream_unknown_kind", [](mc_store_t *s) { return ranges_on(s, g_known, g_out_rows, g_out_size_rows, g_zero_rows, g_one, 3); }},
        {"ranges_on_stream_null_ticket_out", [](mc_store_t *s) { return (int64_t)mc_store_get_into_ranges_on_stream(s, g_known, 1, g_out_rows, g_out_size_rows, g_zero_rows, g_one, MC_STREAM_HOST, host(), nullptr); }},
        // on-stream puts (nothing is reserved by a refused call)
        {"put_on_stream_null_store", [](mc_store_t *) { return put_on(nullptr, g_known, g_src, g_out_size, 1, nullptr, MC_STREAM_HOST); }},
        {"put_on_stream_null_keys", [](mc_store_t *s) { return put_on(s, nullptr, g_src, g_out_size, 1, nullptr, MC_STREAM_HOST); }},
        {"put_on_stream_null_bufs", [](mc_store_t *s) { return put_on(s, g_known, nullptr, g_out_size, 1, nullptr, MC_STREAM_HOST); }},
        {"put_on_stream_null_sizes", [](mc_store_t *s) { return put_on(s, g_known, g_src, nullptr, 1, nullptr, MC_STREAM_HOST); }},
        {"put_on_stream_duplicate_key", [](mc_store_t *s) { return put_on(s, g_dup_keys, g_cbufs, g_sizes, kN, nullptr, MC_STREAM_HOST); }},
        {"put_on_stream_bad_cfg_enum", [](mc_store_t *s) { mc_replicate_config_t c = config_with([](mc_replicate_config_t &x) { x.soft_pin_action = 9; }); return put_on(s, g_known, g_src, g_out_size, 1, &c, MC_STREAM_HOST); }},
        {"put_on_stream_unknown_kind", [](mc_store_t *s) { return put_on(s, g_known, g_src, g_out_size, 1, nullptr, 3); }},
        {"put_on_stream_null_ticket_out", [](mc_store_t *s) { return (int64_t)mc_store_batch_put_from_on_stream(s, g_known, g_src, g_out_size, 1, nullptr, MC_STREAM_HOST, host(), nullptr); }},
        {"put_multi_on_stream_null_store", [](mc_store_t *) { return put_multi_on(nullptr, g_src_rows, g_one, MC_STREAM_HOST); }},
        {"put_multi_on_stream_null_bufs", [](mc_store_t *s) { return put_multi_on(s, nullptr, g_one, MC_STREAM_HOST); }},
        {"put_multi_on_stream_null_buf_counts", [](mc_store_t *s) { return put_multi_on(s, g_src_rows, nullptr, MC_STREAM_HOST); }},
        {"put_multi_on_stream_unknown_kind", [](mc_store_t *s) { return put_multi_on(s, g_src_rows, g_one, -2); }},
        {"put_multi_on_stream_null_ticket_out", [](mc_store_t *s) { return (int64_t)mc_store_batch_put_from_multi_buffers_on_stream(s, g_known, 1, g_src_rows, g_out_size_rows, g_one, nullptr, MC_STREAM_HOST, host(), nullptr); }},
        // tickets (NULL ticket: -600, or 0 / NULL where the return type has no code)
        {"ticket_status_null", [](mc_store_t *) { return (int64_t)mc_ticket_status(nullptr); }},
        {"ticket_wait_null", [](mc_store_t *) { return (int64_t)mc_ticket_wait(nullptr, 0); }},
        {"ticket_key_count_null", [](mc_store_t *) { return (int64_t)mc_ticket_key_count(nullptr); }, 0},
        {"ticket_status_word_null", [](mc_store_t *) { return (int64_t)(mc_ticket_status_word(nullptr) != nullptr); }, 0},
        {"ticket_results_null_ticket", [](mc_store_t *) { return (int64_t)mc_ticket_results(nullptr, g_lres, 1); }},
        {"ticket_results_null_results", [](mc_store_t *s) { return with_ticket(s, [](mc_ticket_t *t) { return (int64_t)mc_ticket_results(t, nullptr, 1); }); }},
        {"ticket_results_count_too_big", [](mc_store_t *s) { return with_ticket(s, [](mc_ticket_t *t) { return (int64_t)mc_ticket_results(t, g_lres, kN); }); }},
        {"ticket_results_count_zero", [](mc_store_t *s) { return with_ticket(s, [](mc_ticket_t *t) { return (int64_t)mc_ticket_results(t, g_lres, 0); }); }},
        // host streams and events
        {"host_stream_launch_null_stream", [](mc_store_t *) { return (int64_t)mc_host_stream_launch(nullptr, [](void *) {}, nullptr); }},
        {"host_stream_launch_null_func", [](mc_store_t *) { return (int64_t)mc_host_stream_launch(ArgsEnv::stream(), nullptr, nullptr); }},
        {"host_stream_wait_event_null_stream", [](mc_store_t *) { return with_event([](mc_host_event_t *e) { return (int64_t)mc_host_stream_wait_event(nullptr, e); }); }},
        {"host_stream_wait_event_null_event", [](mc_store_t *) { return (int64_t)mc_host_stream_wait_event(ArgsEnv::stream(), nullptr); }},
        {"host_stream_synchronize_null", [](mc_store_t *) { return (int64_t)mc_host_stream_synchronize(nullptr, 0); }},
        {"host_event_record_null_event", [](mc_store_t *) { return (int64_t)mc_host_event_record(nullptr, ArgsEnv::stream()); }},
        {"host_event_record_null_stream", [](mc_store_t *) { return with_event([](mc_host_event_t *e) { return (int64_t)mc_host_event_record(e, nullptr); }); }},
        {"host_event_query_null", [](mc_store_t *) { return (int64_t)mc_host_event_query(nullptr); }},
        {"host_event_wait_null", [](mc_store_t *) { return (int64_t)mc_host_event_wait(nullptr, 0); }},
    };
    return all;
}

// Printed by gtest in test listings and failures: the case name, not the object's bytes.
void PrintTo(const Case &c, std::ostream *os) { *os << c.name; }

class CapiArgs : public ::testing::TestWithParam<Case> {};

TEST_P(CapiArgs, RejectedWithCodeAndMessage) {
    mc_store_t *store = ArgsEnv::store();
    ASSERT_NE(store, nullptr) << "embedded store setup failed: " << test::last_error();
    EXPECT_EQ(GetParam().call(store), GetParam().expected) << test::last_error();
    std::string message = test::last_error();
    EXPECT_FALSE(message.empty());
    // The handle is not poisoned: it still answers correctly.
    EXPECT_EQ(mc_store_get_size(store, "args/known"), 1) << test::last_error();
}

INSTANTIATE_TEST_SUITE_P(AllFunctions, CapiArgs, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case> &info) {
                             return std::string(info.param.name);
                         });

TEST(CapiMisc, StaticStringsAndNullTolerantHelpers) {
    EXPECT_STREQ(mc_strerror(0), "OK");
    EXPECT_STREQ(mc_strerror(-704), "OBJECT_NOT_FOUND");
    EXPECT_STREQ(mc_strerror(-600), "INVALID_PARAMS");
    EXPECT_STREQ(mc_strerror(123456), "UNKNOWN_ERROR");
    EXPECT_STREQ(mc_strerror(INT64_MIN), "UNKNOWN_ERROR");
    ASSERT_NE(mc_version(), nullptr);
    EXPECT_NE(std::strlen(mc_version()), 0u);
    EXPECT_EQ(mc_buffer_ptr(nullptr), nullptr);
    EXPECT_EQ(mc_buffer_len(nullptr), 0u);
    mc_buffer_free(nullptr);
    mc_store_free(nullptr);
    mc_ticket_free(nullptr);
    mc_host_stream_free(nullptr);
    mc_host_event_free(nullptr);
    mc_setup_config_init(nullptr);
    mc_replicate_config_init(nullptr);
    // A NULL or empty key file path is refused and leaves the process without a key.
    EXPECT_EQ(mc_set_cluster_key_file(nullptr), kInvalid);
    EXPECT_EQ(mc_set_cluster_key_file(""), kInvalid);
    EXPECT_EQ(mooncake_rs::RealClient::set_cluster_key_file(""), kInvalid);
}

TEST(CapiMisc, LastErrorMessageTruncatesAndReportsFullLength) {
    EXPECT_EQ(mc_store_put(nullptr, "k", "v", 1, nullptr), kInvalid);
    size_t full = mc_last_error_message(nullptr, 0);
    ASSERT_GT(full, 3u);
    char small[4] = {'x', 'x', 'x', 'x'};
    EXPECT_EQ(mc_last_error_message(small, sizeof small), full);
    EXPECT_EQ(small[3], '\0');
    EXPECT_EQ(std::strlen(small), 3u);
    std::string whole(full + 1, '\0');
    EXPECT_EQ(mc_last_error_message(whole.data(), whole.size()), full);
    EXPECT_EQ(std::strlen(whole.c_str()), full);
}

TEST(CapiMisc, MessagesArePerThread) {
    EXPECT_EQ(mc_store_put(nullptr, "k", "v", 1, nullptr), kInvalid);
    std::string here = test::last_error();
    std::string there = "unset";
    std::thread other([&] { there = test::last_error(); });
    other.join();
    EXPECT_FALSE(here.empty());
    EXPECT_TRUE(there.empty()) << there;
}

TEST(CapiMisc, DefaultConfigsMatchMooncake) {
    mc_setup_config_t s;
    std::memset(&s, 0xab, sizeof s);
    mc_setup_config_init(&s);
    EXPECT_EQ(s.global_segment_size, 16 * test::kMiB);
    EXPECT_EQ(s.local_buffer_size, 16 * test::kMiB);
    EXPECT_STREQ(s.protocol, "tcp");
    EXPECT_STREQ(s.master_server_addr, "127.0.0.1:50051");
    mc_replicate_config_t r;
    std::memset(&r, 0xab, sizeof r);
    mc_replicate_config_init(&r);
    EXPECT_EQ(r.replica_num, 1u);
    EXPECT_EQ(r.soft_pin_action, 0);
    EXPECT_LT(r.soft_pin_ttl_ms, 0);
    EXPECT_EQ(r.with_hard_pin, 0);
    EXPECT_EQ(r.preferred_segments_count, 0u);
}

}  // namespace
