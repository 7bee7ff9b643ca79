#!/usr/bin/env bash
# The main job on a fresh machine: installs the one build tool the Rust toolchain lacks
# (protoc, Debian's protobuf-compiler, which the etcd client's build needs) when missing, then
# runs the embedded store demo (put, get, batch, remove; no external services).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v protoc >/dev/null 2>&1; then
  echo "== installing protobuf-compiler"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq protobuf-compiler >/dev/null
fi
exec cargo run --release --example embedded_demo
