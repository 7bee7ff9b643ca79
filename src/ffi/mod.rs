//! The C surface (`mc_*` and Mooncake's `mooncake_store_*`).
