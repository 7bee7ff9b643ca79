#!/usr/bin/env bash
# Builds the Python package (python/, maturin) into a fresh virtual environment under
# target/python-venv (recreated every run), then runs its pytest suite against a real
# mooncake_master that the fixtures start on free loopback ports.
#
# Needs Python >= 3.11 with pip and the venv module (Debian: python3-venv, installed here when
# missing), and PyPI access for maturin, pytest, numpy and safetensors. Exits with pytest's status, or 1 when
# a test skipped for any reason but a missing torch (the optional torch tests).
#
# Environment:
#   PYTHON              interpreter to build the venv from (default: python3)
#   MC_TEST_MASTER_BIN  master binary the fixtures start (default: the venv's mooncake_master)
#   PYTEST_ARGS         extra pytest arguments, e.g. "-k zero_copy -x"
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

echo "== fresh virtual environment in $VENV"
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
PATH="$PWD/$VENV/bin:$PATH"
export PATH
python -m pip install -q --upgrade pip
python -m pip install -q "maturin>=1.5,<2" pytest numpy safetensors

echo "== pip install --no-build-isolation ./python"
python -m pip install -q --no-build-isolation ./python

echo "== pytest python/tests"
# No bytecode or cache files in the source tree.
export PYTHONDONTWRITEBYTECODE=1
report="target/python-junit.xml"
rm -f "$report"
status=0
# shellcheck disable=SC2086 # PYTEST_ARGS is a list of words on purpose
python -m pytest python/tests -v -p no:cacheprovider --junitxml="$report" ${PYTEST_ARGS:-} || status=$?
# A skip is allowed only for the optional torch tests: any other skip (a module that did not
# import, a fixture that gave up) fails the run, so the suite cannot pass by not running.
python - "$report" <<'PY' || status=1
import sys
import xml.etree.ElementTree as ET

bad = []
for case in ET.parse(sys.argv[1]).iter("testcase"):
    where = f"{case.get('classname')}::{case.get('name')}"
    for skip in case.iter("skipped"):
        message = skip.get("message", "")
        # test_torch.py skips as a whole ("collection skipped") when torch is not installed.
        if "test_torch" not in where and "torch" not in message:
            bad.append(f"{where}: {message}")
if bad:
    print(f"python-tests: {len(bad)} unexpected skips (only the torch tests may skip):")
    print("\n".join(bad))
    sys.exit(1)
PY
exit $status
