"""Console script ``mooncake_client``: the standalone store client (mooncake-rs's
``mooncake_client`` binary, run inside the extension) with this process's argv; exits with
its status."""

import sys

import mooncake.store


def main():
    sys.exit(mooncake.store._run_client(sys.argv))
