"""The console scripts run our binaries inside the extension (spec §1.2)."""

import selectors
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

import mooncake.store  # noqa: F401  (a plain import: an extension that fails to load fails)

TIMEOUT_S = 60


def run_entry(module, *args):
    code = f"import sys; sys.argv = {['prog', *args]!r}; import {module}; {module}.main()"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=TIMEOUT_S)


@pytest.mark.parametrize("module", ["mooncake.cli", "mooncake.cli_client",
                                    "mooncake.http_metadata_server"])
def test_help_exits_zero(module):
    r = run_entry(module, "--help")
    assert r.returncode == 0, r.stderr
    assert "--" in r.stdout + r.stderr


def test_master_refuses_an_unknown_flag():
    r = run_entry("mooncake.cli", "--no_such_flag_at_all=1")
    assert r.returncode != 0


def ready_line(process):
    """The first stdout line of `process`, waiting at most TIMEOUT_S."""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            if selector.select(timeout=deadline - time.monotonic()):
                return process.stdout.readline().decode()
    raise AssertionError(f"no line from the server within {TIMEOUT_S} s")


def test_http_metadata_server_serves_upstreams_routes_until_sigterm():
    server = subprocess.Popen(
        [sys.executable, "-m", "mooncake.http_metadata_server", "--host", "127.0.0.1",
         "--port", "0", "--log-level", "WARNING"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        line = ready_line(server)
        assert line.startswith("READY 127.0.0.1:"), line
        url = f"http://{line.split()[1]}/metadata?key="

        def call(method, key, body=None):
            request = urllib.request.Request(url + key, data=body, method=method)
            try:
                with urllib.request.urlopen(request, timeout=10) as answer:
                    return answer.status, answer.read()
            except urllib.error.HTTPError as error:
                return error.code, error.read()

        assert call("GET", "mooncake/ram/a")[0] == 404
        assert call("PUT", "mooncake/ram/a", b'{"x": 1}')[0] == 200
        assert call("GET", "mooncake/ram/a") == (200, b'{"x": 1}')
        assert call("DELETE", "mooncake/ram/a")[0] == 200
        assert call("GET", "mooncake/ram/a")[0] == 404
        assert call("GET", "")[0] == 400
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=TIMEOUT_S) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=TIMEOUT_S)


def test_http_metadata_server_refuses_a_bad_port_and_a_taken_one():
    r = run_entry("mooncake.http_metadata_server", "--port", "70000")
    assert r.returncode == 2, r.stderr
    r = run_entry("mooncake.http_metadata_server", "--log-level", "DEBUG", "--minloglevel=1")
    assert r.returncode == 2 and "not both" in r.stderr, r.stderr
    blocker = subprocess.Popen(
        [sys.executable, "-m", "mooncake.http_metadata_server", "--host", "127.0.0.1",
         "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        port = ready_line(blocker).split(":")[-1].strip()
        r = run_entry("mooncake.http_metadata_server", "--host", "127.0.0.1", "--port", port)
        assert r.returncode == 1, r.stderr
        assert "cannot serve metadata" in r.stderr
    finally:
        blocker.send_signal(signal.SIGTERM)
        blocker.wait(timeout=TIMEOUT_S)
