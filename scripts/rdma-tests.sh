#!/usr/bin/env bash
# The RDMA leg: builds the RDMA test binaries on the host (release, default target CPU, so
# they run under the guest's Nehalem model), then runs them in ONE boot of the soft-RoCE VM
# (../shared/tools/rdma-vm, which installs its own Debian packages on first use), bounded
# by -t, each in both completion modes (MC_RDMA_COMPLETION=poll, then event). Exit status:
# the tests' (124: the VM timed out, 125: the VM did not start).
#
#   scripts/rdma-tests.sh            # lib verbs tests, tests/rdma.rs, device memory over RDMA,
#                                    # the SSD tier's disk faults (dm error target, a full disk),
#                                    # and the SIGBUS-guard tests (they need a kernel of their own)
#   RDMA_VM_TOOL=/path/run-in-rdma-vm.sh RDMA_VM_LIMIT_S=480 scripts/rdma-tests.sh
set -euo pipefail
cd "$(dirname "$0")/.."

tool="${RDMA_VM_TOOL:-../shared/tools/rdma-vm/run-in-rdma-vm.sh}"
limit="${RDMA_VM_LIMIT_S:-480}"

# The file name of the test executable cargo built for `selector`.
executable() {
  cargo test --release --locked "$@" --no-run >&2
  cargo test --release --locked "$@" --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["executable"])' | tail -n 1
}

echo "== building the RDMA test binaries"
# No separate `cargo build --bins`: the tests reach the binaries through CARGO_BIN_EXE_*, which
# `cargo test` builds with the test build's feature set; a plain build of the bins would compile
# the library a second time with other features (minutes on CI's 2 cores).
lib="$(executable --lib)"
itest="$(executable --test rdma)"
devtest="$(executable --test device_standin)"
ssdtest="$(executable --test ssd_tier)"
[ -x "$lib" ] && [ -x "$itest" ] && [ -x "$devtest" ] && [ -x "$ssdtest" ] ||
  { echo "test binaries not found" >&2; exit 1; }

echo "== running them in the RDMA VM (limit ${limit}s)"
# MC_SAME_HOST=0: the "two nodes" are processes of one host, which would otherwise exchange
# bytes through mapped segments instead of the NIC.
# A second soft-RoCE device (rxe1 on its own dummy netdev) for the multi-device tests
# (RDMA_VM_DEV2); its link-local address only gives it a RoCE v2 GID.
"$tool" -t "$limit" -- bash -c "
  set -e
  export MC_SAME_HOST=0
  ip link add rxenet1 type dummy
  ip link set rxenet1 mtu 9000 up
  ip addr add 169.254.78.1/32 dev rxenet1
  rdma link add rxe1 type rxe netdev rxenet1
  for _ in \$(seq 100); do rdma link show rxe1/1 | grep -q ACTIVE && break; sleep 0.05; done
  rdma link show rxe1/1 | grep -q ACTIVE || { echo 'rxe1 did not become active' >&2; exit 1; }
  export RDMA_VM_DEV2=rxe1
  # A test that finds no device returns early and passes, printing 'skipped:'. In here every
  # one must run: the leg fails on any such line, or when a filter matched no test, rather
  # than pass having tested nothing.
  set -o pipefail
  log=\$(mktemp)
  for mode in poll event; do
    export MC_RDMA_COMPLETION=\$mode
    echo \"-- MC_RDMA_COMPLETION=\$mode: lib transfer::rdma\"
    '$lib' transfer::rdma:: --test-threads=1 --nocapture 2>&1 | tee \$log
    ! grep 'skipped:' \$log || { echo 'a lib RDMA test skipped inside the VM' >&2; exit 1; }
    grep -Eq 'test result: ok\\. [1-9][0-9]* passed' \$log || { echo 'no lib RDMA test ran' >&2; exit 1; }
    echo \"-- MC_RDMA_COMPLETION=\$mode: tests/rdma.rs\"
    '$itest' --test-threads=1 --nocapture 2>&1 | tee \$log
    ! grep 'skipped:' \$log || { echo 'a tests/rdma.rs test skipped inside the VM' >&2; exit 1; }
    grep -Eq 'test result: ok\\. [1-9][0-9]* passed' \$log || { echo 'no tests/rdma.rs test ran' >&2; exit 1; }
    echo \"-- MC_RDMA_COMPLETION=\$mode: tests/device_standin.rs over RDMA\"
    '$devtest' over_rdma --test-threads=1 --nocapture 2>&1 | tee \$log
    ! grep 'skipped:' \$log || { echo 'the device-memory RDMA test skipped inside the VM' >&2; exit 1; }
    grep -q '1 passed' \$log || { echo 'no device-memory RDMA test ran' >&2; exit 1; }
  done
  # The SSD tier over a real full disk and a real EIO (device-mapper's error target).
  echo '-- tests/ssd_tier.rs: a full disk and EIO under the tier'
  '$ssdtest' in_the_vm --test-threads=1 2>&1 | tee \$log
  ! grep 'skipped:' \$log || { echo 'the disk fault test skipped inside the VM' >&2; exit 1; }
  grep -q 'test result: ok. 1 passed' \$log || { echo 'the disk fault test did not run and pass' >&2; exit 1; }
  # Last, one at a time: the SIGBUS tests switch this kernel to strict overcommit for a moment
  # (a test that dies there leaves it strict, and nothing after it could start).
  echo '-- lib: holes punched in shared files under strict overcommit (SIGBUS guard)'
  '$lib' --ignored a_hole_punched --test-threads=1 --nocapture 2>&1 | tee \$log
  grep -q 'test result: ok. 3 passed' \$log || { echo 'the SIGBUS tests did not all run and pass' >&2; exit 1; }
"
