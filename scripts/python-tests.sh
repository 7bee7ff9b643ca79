#!/usr/bin/env bash
# Builds the Python package (python/, maturin) into a fresh virtual environment under
# target/python-venv (recreated every run), then runs its pytest suite against a real
# mooncake_master that the fixtures start on free loopback ports. Then the tests that use torch
# once more with torch present: Debian's python3-torch (a CPU build; installed here when missing,
# PyTorch's own wheel index being out of CI's reach) seen by a second virtual environment,
# target/python-torch-venv, made from the system interpreter with its site packages. Between
# the two, mooncake.engine's two-process test over RDMA, in the soft-RoCE VM
# (../shared/tools/rdma-vm, or RDMA_VM_TOOL).
#
# Needs Python >= 3.11 with pip and the venv module (Debian: python3-venv, installed here when
# missing), PyPI access for maturin, pytest, numpy and safetensors, apt for python3-torch, and
# root (or sudo) for the VM. Exits with pytest's status, or 1 when a test skipped for any
# reason but torch being absent (first pass) or present (second pass), or when the RDMA test
# failed or did not run.
#
# Environment:
#   PYTHON              interpreter to build the venv from (default: python3)
#   MC_TEST_MASTER_BIN  master binary the fixtures start (default: the venv's mooncake_master)
#   PYTEST_ARGS         extra pytest arguments, e.g. "-k zero_copy -x"
#   RDMA_VM_TOOL        the VM runner (default: ../shared/tools/rdma-vm/run-in-rdma-vm.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV="target/python-venv"

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "python-tests.sh: the abi3 build needs CPython >= 3.11; $PYTHON is $("$PYTHON" -V 2>&1)" >&2
  echo "(for 3.10: MATURIN_PEP517_ARGS=--no-default-features, see docs/python.md)" >&2
  exit 1
fi

if ! "$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  echo "== installing python3-venv"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >/dev/null
fi

PY_TESTS_STATUS=0
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
# No bytecode or cache files in the source tree.
export PYTHONDONTWRITEBYTECODE=1

# fresh_venv DIR PYTHON [venv options]: DIR recreated from PYTHON with the build and test tools
# and this package installed; its bin/ first on PATH.
fresh_venv() {
  local dir="$1" python="$2"
  shift 2
  echo "== fresh virtual environment in $dir"
  rm -rf "$dir"
  "$python" -m venv "$@" "$dir"
  PATH="$PWD/$dir/bin:$ORIGINAL_PATH"
  export PATH
  python -m pip install -q --upgrade pip
  python -m pip install -q "maturin>=1.5,<2" pytest numpy safetensors
  echo "== pip install --no-build-isolation ./python ($dir)"
  python -m pip install -q --no-build-isolation ./python
}

# run_pytest REPORT SKIP_WORD TESTS...: pytest over TESTS; any skip whose reason does not name
# SKIP_WORD fails the run, so the suite cannot pass by not running.
run_pytest() {
  local report="$1" allowed="$2"
  shift 2
  rm -f "$report"
  # shellcheck disable=SC2086 # PYTEST_ARGS is a list of words on purpose
  python -m pytest "$@" -v -p no:cacheprovider --junitxml="$report" ${PYTEST_ARGS:-} ||
    PY_TESTS_STATUS=$?
  python - "$report" "$allowed" <<'PY' || PY_TESTS_STATUS=1
import sys
import xml.etree.ElementTree as ET

report, allowed = sys.argv[1:]
bad = []
for case in ET.parse(report).iter("testcase"):
    where = f"{case.get('classname')}::{case.get('name')}"
    for skip in case.iter("skipped"):
        message = skip.get("message", "")
        # test_torch.py skips as a whole ("collection skipped") when torch is not installed.
        whole_module = allowed == "needs torch" and "test_torch" in where
        if allowed not in message and not whole_module:
            bad.append(f"{where}: {message}")
if bad:
    print(f"python-tests: {len(bad)} unexpected skips (only '{allowed}' may skip):")
    print("\n".join(bad))
    sys.exit(1)
PY
}

ORIGINAL_PATH="$PATH"
fresh_venv "$VENV" "$PYTHON"
echo "== pytest python/tests"
run_pytest target/python-junit.xml "needs torch" python/tests

# mooncake.engine between two processes over soft-RoCE: the test exists only inside the VM
# (RDMA_VM=1); MC_FORCE_HCA=1 makes a device that does not open a failure, not TCP.
echo "== mooncake.engine over RDMA in the soft-RoCE VM"
rdma_log=$(mktemp)
$SUDO "${RDMA_VM_TOOL:-../shared/tools/rdma-vm/run-in-rdma-vm.sh}" -t 300 --env MC_FORCE_HCA=1 \
  --env PYTHONDONTWRITEBYTECODE=1 -- "$VENV/bin/python" -m pytest -v -p no:cacheprovider \
  python/tests/test_transfer_engine.py -k over_rdma 2>&1 | tee "$rdma_log" || PY_TESTS_STATUS=1
grep -Eq '(^|[^0-9])1 passed' "$rdma_log" || { echo "python-tests: the RDMA test did not run and pass"; PY_TESTS_STATUS=1; }
rm -f "$rdma_log"

TORCH_PYTHON=/usr/bin/python3
if ! "$TORCH_PYTHON" -c 'import torch' >/dev/null 2>&1; then
  echo "== installing python3-torch"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-torch python3-venv >/dev/null
fi
fresh_venv target/python-torch-venv "$TORCH_PYTHON" --system-site-packages
echo "== pytest with torch $(python -c 'import torch; print(torch.__version__)')"
run_pytest target/python-torch-junit.xml "torch is installed" \
  python/tests/test_tensor.py python/tests/test_parallel.py python/tests/test_torch.py \
  python/tests/test_standalone.py
exit $PY_TESTS_STATUS
