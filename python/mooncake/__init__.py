"""mooncake: Mooncake Store's Python package, backed by the mooncake-rs client (Rust)."""
