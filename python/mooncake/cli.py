"""Console script ``mooncake_master``: the master (mooncake-rs's ``mooncake_master`` binary,
run inside the extension) with this process's argv; exits with its status."""

import sys

import mooncake.store


def main():
    sys.exit(mooncake.store._run_master(sys.argv))
