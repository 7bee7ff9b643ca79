/*
 * store_c.h — Mooncake Store's existing C API, served by libmooncake_rs
 * (SONAME libmooncake_rs.so.0).
 *
 * Source-compatible with Mooncake's mooncake-store/include/store_c.h: the same 19 functions,
 * types and semantics, so a program written against Mooncake's header compiles, links and
 * behaves the same. The richer API is in mooncake_rs.h (mc_*); both may be included in one
 * translation unit, and a mooncake_store_t handle is internally the same object as an
 * mc_store_t.
 *
 * Conventions (as Mooncake):
 * - Strings passed in are not used after a call returns.
 * - Errors are negative Mooncake ErrorCodes (-600 INVALID_PARAMS, -704 OBJECT_NOT_FOUND, ...);
 *   -1 is returned for this API's own argument checks (NULL store, NULL key, NULL buffer with
 *   a non-zero size, ...) and after an internal failure. mc_last_error_message() (in
 *   mooncake_rs.h) gives a detail for the calling thread.
 * - Batch functions return 0 and write one result per key into results_out.
 * - A handle may be used from many threads at once; mooncake_store_destroy must be the last
 *   call on it.
 *
 * Hand-written (not generated); tests/ffi_header.rs checks every prototype against the Rust
 * definitions in src/ffi/store_c.rs.
 */

#ifndef MOONCAKE_STORE_C_H
#define MOONCAKE_STORE_C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Opaque store handle. */
typedef void *mooncake_store_t;

/** Replication settings (32 bytes on LP64). NULL config pointers mean one replica. */
struct mooncake_replicate_config {
    size_t replica_num;              /**< memory replicas; 0 is rejected (-600) */
    int with_soft_pin;               /**< non-zero: soft pin with the default TTL */
    int with_hard_pin;               /**< non-zero: never evicted */
    const char **preferred_segments; /**< preferred segment names; NULL entries skipped */
    size_t preferred_segments_count; /**< entries in preferred_segments */
};
typedef struct mooncake_replicate_config mooncake_replicate_config_t;

/* Lifecycle */

/** Creates a handle (NULL on failure). Release with mooncake_store_destroy. */
mooncake_store_t mooncake_store_create(void);

/** Tears down and releases the handle. NULL is fine. */
void mooncake_store_destroy(mooncake_store_t store);

/**
 * Sets the client up. NULL strings become "" except protocol ("tcp") and master_server_addr
 * ("127.0.0.1:50051"); master_server_addr "embedded" runs the master in-process.
 * Returns 0 or a negative code; -1 if store is NULL.
 */
int mooncake_store_setup(mooncake_store_t store, const char *local_hostname,
                         const char *metadata_server, uint64_t global_segment_size,
                         uint64_t local_buffer_size, const char *protocol,
                         const char *device_name, const char *master_server_addr);

/** In-process master plus a "localhost" client. Returns 0 or a negative code. */
int mooncake_store_init_all(mooncake_store_t store, const char *protocol,
                            const char *device_name, uint64_t mount_segment_size);

/** 0 healthy, 1 not initialised, 2 master unreachable; -1 if store is NULL. */
int mooncake_store_health_check(mooncake_store_t store);

/* Put */

/** Copying put (insert-if-absent; an existing key returns 0). -1 on NULL store/key or a
 *  NULL value with size > 0. */
int mooncake_store_put(mooncake_store_t store, const char *key, const void *value, size_t size,
                       const mooncake_replicate_config_t *config);

/** Zero-copy put from buffer. Same codes as mooncake_store_put. */
int mooncake_store_put_from(mooncake_store_t store, const char *key, void *buffer, size_t size,
                            const mooncake_replicate_config_t *config);

/** Zero-copy batch put; 0 with per-key codes in results_out; -1 on a NULL argument. */
int mooncake_store_batch_put_from(mooncake_store_t store, const char **keys, void **buffers,
                                  const size_t *sizes, size_t count,
                                  const mooncake_replicate_config_t *config, int *results_out);

/* Get */

/** Reads key into buffer; the object size or a negative code (-600 buffer too small). */
int64_t mooncake_store_get_into(mooncake_store_t store, const char *key, void *buffer,
                                size_t size);

/** Batch read; 0 with per-key sizes or codes in results_out; -1 on a NULL argument. */
int mooncake_store_batch_get_into(mooncake_store_t store, const char **keys, void **buffers,
                                  const size_t *sizes, size_t count, int64_t *results_out);

/* Existence, size, hostname */

/** 1 exists, 0 missing, negative on error (grants a read lease). */
int mooncake_store_is_exist(mooncake_store_t store, const char *key);

/** 0 with 1 / 0 / negative per key in results_out; -1 on a NULL argument. */
int mooncake_store_batch_is_exist(mooncake_store_t store, const char **keys, size_t count,
                                  int *results_out);

/** Object size or a negative code (-704 missing). */
int64_t mooncake_store_get_size(mooncake_store_t store, const char *key);

/** Copies the client's hostname NUL-terminated; -1 on NULL or buf_len <= strlen. */
int mooncake_store_get_hostname(mooncake_store_t store, char *buf_out, size_t buf_len);

/* Remove */

/** Removes key (force non-zero ignores read leases). 0 or a negative code. */
int mooncake_store_remove(mooncake_store_t store, const char *key, int force);

/** Removes objects whose key matches pattern (substring regex); the count or negative. */
int64_t mooncake_store_remove_by_regex(mooncake_store_t store, const char *pattern, int force);

/** Removes every object; the count or negative. */
int64_t mooncake_store_remove_all(mooncake_store_t store, int force);

/* Buffer registration (zero-copy) */

/** Registers [buffer, buffer + size); -1 on NULL or size 0. */
int mooncake_store_register_buffer(mooncake_store_t store, void *buffer, size_t size);

/** Unregisters a buffer registered before. */
int mooncake_store_unregister_buffer(mooncake_store_t store, void *buffer);

#ifdef __cplusplus
}
#endif

#endif /* MOONCAKE_STORE_C_H */
