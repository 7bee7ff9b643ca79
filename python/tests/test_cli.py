"""The console scripts run our binaries inside the extension (spec §1.2)."""

import subprocess
import sys

import pytest

import mooncake.store  # noqa: F401  (a plain import: an extension that fails to load fails)

TIMEOUT_S = 60


def run_entry(module, *args):
    code = f"import sys; sys.argv = {['prog', *args]!r}; import {module}; {module}.main()"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=TIMEOUT_S)


@pytest.mark.parametrize("module", ["mooncake.cli", "mooncake.cli_client"])
def test_help_exits_zero(module):
    r = run_entry(module, "--help")
    assert r.returncode == 0, r.stderr
    assert "--" in r.stdout + r.stderr


def test_master_refuses_an_unknown_flag():
    r = run_entry("mooncake.cli", "--no_such_flag_at_all=1")
    assert r.returncode != 0
