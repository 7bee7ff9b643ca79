#!/usr/bin/env bash
# Runs every test of the project on a fresh machine: installs the Debian packages the C/C++
# tests, the etcd tests (etcd-server), the etcd client's build (protobuf-compiler) and the
# SSD tier's disk-fault test in the VM (e2fsprogs, dmsetup) need (when missing), then cargo fmt/clippy checks, cargo tests (with a bounded chaos
# soak and the network fuzzer; the library's and the single-process suites once more with
# debug assertions and overflow checks), the RDMA leg in the soft-RoCE VM (scripts/rdma-tests.sh, which
# installs its own packages), a bounded run of every cargo-fuzz target
# (scripts/fuzz-smoke.sh), the Python package's pytest suite (built into a fresh virtual
# environment; its torch tests once more with Debian's python3-torch) and the ctest suites (plain and AddressSanitizer builds).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
for pkg in cmake g++ libgtest-dev etcd-server protobuf-compiler e2fsprogs dmsetup; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing ${need[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
# The fuzz crate (fuzz/) is not a workspace member: its own fmt and clippy, with the nightly
# toolchain it is built with (installed when missing; no nightly fails the run).
echo "== fuzz crate: cargo fmt --check, cargo clippy"
cargo fmt --manifest-path fuzz/Cargo.toml --all -- --check
scripts/ensure-nightly.sh
cargo +nightly clippy --manifest-path fuzz/Cargo.toml --all-targets --locked -- -D warnings
echo "== cargo test"
cargo test --locked --release
# The bookkeeping debug_assert!s and integer overflow checks are off in release builds: the
# library's tests and the single-process suites once more with both on (Cargo.toml's
# profile.checked; about 5 minutes on 2 cores, the build included).
echo "== cargo test --profile checked"
cargo test --locked --profile checked --lib --test integrity --test embedded_client \
  --test properties --test on_stream --test on_stream_put --test remount
echo "== RDMA (soft-RoCE VM)"
scripts/rdma-tests.sh
echo "== fuzz smoke"
scripts/fuzz-smoke.sh 20
echo "== python (mooncake.store)"
scripts/python-tests.sh
if [ -f CMakeLists.txt ]; then
  echo "== ctest (plain)"
  cmake --preset default >/dev/null
  cmake --build --preset default -j 2
  ctest --preset default
  echo "== ctest (AddressSanitizer)"
  cmake --preset asan >/dev/null
  cmake --build --preset asan -j 2
  ctest --preset asan
fi
