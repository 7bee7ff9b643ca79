#!/usr/bin/env bash
# ctest entry c-example.two_process_rdma: runs `two_process MASTER CLIENT rdma DEV ADDR` inside
# ONE boot of the soft-RoCE VM (../shared/tools/rdma-vm, or RDMA_VM_TOOL). Exits 77 (ctest's
# SKIP_RETURN_CODE) with the reason when the tool is missing or we are not root; otherwise the
# example's status (124: the VM timed out, 125: the VM did not start).
#
#   scripts/rdma-ctest.sh <two_process> <mooncake_master> <mooncake_client>
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
tool="${RDMA_VM_TOOL:-$here/../shared/tools/rdma-vm/run-in-rdma-vm.sh}"
if [ $# -ne 3 ]; then
  echo "usage: $0 <two_process> <mooncake_master> <mooncake_client>" >&2
  exit 2
fi
if [ ! -x "$tool" ]; then
  echo "skipped: the rdma-vm tool is not at $tool (set RDMA_VM_TOOL)"
  exit 77
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "skipped: the rdma-vm tool needs root"
  exit 77
fi
# The VM's current directory is writable; the example writes nothing but needs one that exists.
cd "$here" || exit 2
exec "$tool" -t "${RDMA_VM_LIMIT_S:-240}" -- bash -c \
  'export MC_SAME_HOST=0; exec "$0" "$1" "$2" rdma "$RDMA_VM_DEV" "$RDMA_VM_ADDR"' "$1" "$2" "$3"
