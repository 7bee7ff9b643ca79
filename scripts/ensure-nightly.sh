#!/usr/bin/env bash
# Makes sure `cargo +nightly` works (the fuzz crate is built with it): installs the nightly
# toolchain with rustup (minimal profile, plus clippy and rustfmt) when it is missing. Exits 1,
# loudly, when there is still no nightly: the legs that need it fail rather than skip.
set -euo pipefail
if cargo +nightly --version >/dev/null 2>&1; then
  exit 0
fi
echo "== installing the nightly toolchain (rustup)"
if command -v rustup >/dev/null &&
  rustup toolchain install nightly --profile minimal --component clippy,rustfmt \
    --allow-downgrade; then
  cargo +nightly --version
  exit 0
fi
echo "==================================================================" >&2
echo "no nightly toolchain and rustup could not install one: the fuzz legs cannot run" >&2
echo "==================================================================" >&2
exit 1
