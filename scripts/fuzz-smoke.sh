#!/usr/bin/env bash
# Runs every cargo-fuzz target (fuzz/fuzz_targets/) for a bounded time, starting from the
# committed seed corpus (fuzz/corpus/<target>/, copied so the run never writes into the
# repository). A crash fails the script and leaves its input in fuzz/artifacts/<target>/;
# turn it into a regression test before fixing it.
#
# Needs a nightly toolchain (cargo +nightly; scripts/ensure-nightly.sh installs it with rustup
# when missing) and cargo-fuzz, which is installed from crates.io when missing. Without nightly
# the script fails: the leg never passes without having fuzzed.
#
# Usage: scripts/fuzz-smoke.sh [SECONDS_PER_TARGET]   (default 30; MC_FUZZ_SECONDS also works)
set -euo pipefail

cd "$(dirname "$0")/.."
seconds="${1:-${MC_FUZZ_SECONDS:-30}}"

scripts/ensure-nightly.sh
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "fuzz-smoke: installing cargo-fuzz"
  cargo install --locked cargo-fuzz
fi

cd fuzz
targets=$(cargo +nightly fuzz list)
cargo +nightly fuzz build -O
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for target in $targets; do
  mkdir -p "$work/$target"
  if [ -d "corpus/$target" ]; then
    cp -r "corpus/$target/." "$work/$target/"
  fi
  echo "fuzz-smoke: $target for ${seconds} s"
  # -rss_limit_mb bounds what one input may make the decoder allocate; -timeout bounds one
  # input's time.
  cargo +nightly fuzz run -O "$target" "$work/$target" -- \
    -max_total_time="$seconds" -rss_limit_mb=1024 -timeout=10 -max_len=4096 -print_final_stats=1
done
echo "fuzz-smoke: every target ran ${seconds} s without a crash"
