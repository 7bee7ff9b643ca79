"""Console script ``mooncake_http_metadata_server`` and ``python -m
mooncake.http_metadata_server``: Mooncake's HTTP metadata service (``GET``/``PUT``/``DELETE
/metadata?key=K``) on its own, as upstream's module runs it, served by mooncake-rs's server
inside the extension. Upstream's flags: ``--port`` (8080), ``--host`` (0.0.0.0) and
``--log-level`` (INFO); mooncake-rs's ``--cluster_key_file``, ``--tls_cert_file`` and
``--tls_key_file``, and glog's logging flags (instead of ``--log-level``), pass through. Prints ``READY host:port`` once
listening; serves until SIGINT/SIGTERM; exits with the server's status (2 for a bad flag)."""

import argparse
import sys

import mooncake.store

# Upstream's --log-level as glog's flags: --v=1 shows debug lines, --minloglevel drops below
# (glog's 3 would drop everything, so CRITICAL keeps errors, the most severe lines we log).
_LOG_LEVELS = {
    "DEBUG": ["--v=1", "--minloglevel=0"],
    "INFO": ["--minloglevel=0"],
    "WARNING": ["--minloglevel=1"],
    "ERROR": ["--minloglevel=2"],
    "CRITICAL": ["--minloglevel=2"],
}
_GLOG_LEVEL_FLAGS = ("--minloglevel", "--v")

_EPILOG = ("Also accepted and passed on: --cluster_key_file, --tls_cert_file, --tls_key_file, "
           "and glog's logging flags (--v, --minloglevel, --log_dir, --logtostderr, ...).")


def _argv(args):
    parser = argparse.ArgumentParser(
        prog="mooncake_http_metadata_server",
        description="HTTP Metadata Server for Mooncake (mooncake-rs)",
        epilog=_EPILOG,
    )
    parser.add_argument("--port", type=int, default=8080, help="Port to listen on")
    parser.add_argument("--host", type=str, default="0.0.0.0", help="Host to bind to")
    parser.add_argument("--log-level", type=str, choices=sorted(_LOG_LEVELS), default=None,
                        help="Logging level (default INFO)")
    known, rest = parser.parse_known_args(args)
    if not 0 <= known.port <= 65535:
        parser.error(f"--port {known.port} is not a port")
    glog_level = any(arg.split("=")[0] in _GLOG_LEVEL_FLAGS for arg in rest)
    if known.log_level is not None and glog_level:
        parser.error("give --log-level or glog's --minloglevel / --v, not both")
    level = [] if glog_level else _LOG_LEVELS[known.log_level or "INFO"]
    return (["mooncake_http_metadata_server", f"--host={known.host}", f"--port={known.port}"]
            + level + rest)


def main():
    sys.exit(mooncake.store._run_metadata_server(_argv(sys.argv[1:])))


if __name__ == "__main__":
    main()
