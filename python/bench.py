#!/usr/bin/env python3
"""mc_bench-style numbers for ``mooncake.store``: the module against the C API, same run.

Issue 13 ("Done means"): ``get_into`` of a 4 MiB object and ``batch_get_into`` of 32 x 4 KiB
objects through ``mooncake.store.MooncakeDistributedStore`` against the same calls through
the C API (``libmooncake_rs.so`` via ctypes), measured in the same run, interleaved, with the
same sizes and durations (house rule of mc_bench). Targets: python/C >= 0.95 for the 4 MiB
``get_into`` and >= 0.8 for the batch.

Set-up: a real ``mooncake_master`` on free 127.0.0.1 ports (killed at exit), an OWNER Python
store in a process of its own holding every object in its segment, and two READER clients without a segment
(``global_segment_size`` 0) -- one Python store, one C store -- so both readers fetch the same
objects over the same path (TCP from the owner; a reader only copies locally from its own
segment). Each reader reads into its own registered numpy buffer.

Per scenario: bytes are verified once on each side (a wrong byte or a failed call ends the
run with exit status 1), a few warm-up calls run, then Python and C rounds alternate
(P, C, P, C, ...), each round a fixed duration. The C side's arguments are converted once
before its rounds (ctypes arrays), the Python side converts its lists on every call, as a
framework does: the ratio is the module's cost against the bare C call. Ratios printed: of
the best rounds, of the medians, and the median of the paired ratios (round i of python over
round i of C, measured back to back). The paired median gives the verdict (PASS / BELOW against
the target), as it cancels the load drift of a shared machine; each side's spread (min..max
over rounds) and the paired ratios' spread are printed beside it.

With ``--engine`` it measures ``mooncake.engine.TransferEngine`` instead (issue 34):
``transfer_sync_write`` of 4 MiB and ``batch_transfer_sync_write`` of 64 x 64 KiB from the
Python module against the same transfers run back to back inside the Rust engine
(``TransferEngine._transfer_repeat``, 8 per call, GIL released: the limit without Python's
per-call cost), between two engines of this process over TCP on 127.0.0.1 with P2P handshake
names, alternating rounds as above. Target: python/rust >= 0.95 (paired median).

Usage: ``python python/bench.py [--quick] [--json] [--engine] [--master-bin PATH] [--lib PATH]``.
Exit status: 0 after a complete run (PASS or BELOW), 1 on a wrong byte or a failed call or
set-up, 2 on bad arguments.
"""

import argparse
import ctypes
import json
import os
import platform
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

KIB = 1024
MIB = 1024 * KIB
REPO_ROOT = Path(__file__).resolve().parent.parent
OWNER_SEGMENT_SIZE = 64 * MIB
OWNER_LOCAL_BUFFER_SIZE = 16 * MIB
READER_LOCAL_BUFFER_SIZE = 16 * MIB
MASTER_START_TIMEOUT_S = 30.0
MASTER_STOP_TIMEOUT_S = 10.0
WARMUP_CALLS = 20
# (rounds per side, seconds per round)
QUICK = (5, 0.8)
FULL = (20, 1.25)


class BenchError(Exception):
    """A failed call, a wrong byte or a failed set-up: the run ends with exit status 1."""


# --- ports and the master ----------------------------------------------------------------

_handed_out_ports = set()


def free_port():
    """A 127.0.0.1 TCP port that was free just now and that no earlier call returned."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out_ports:
            _handed_out_ports.add(port)
            return port
    raise BenchError("no fresh free port after 100 tries")


def port_accepts(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_until(predicate, timeout_s, interval_s=0.02):
    """Polls ``predicate`` until it is true (True) or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
    return True


def default_master_bin():
    return shutil.which("mooncake_master") or str(REPO_ROOT / "target/release/mooncake_master")


class Master:
    """A ``mooncake_master`` child on free loopback ports; a context manager that stops it.

    Its output goes to a temporary log file whose tail is shown when it does not come up.
    """

    def __init__(self, binary):
        self.rpc_port = free_port()
        self.args = [
            binary,
            "--rpc_address=127.0.0.1",
            f"--rpc_port={self.rpc_port}",
            "--enable_http_metadata_server=false",
            "--metrics_host=127.0.0.1",
            f"--metrics_port={free_port()}",
        ]
        self.log = tempfile.NamedTemporaryFile(prefix="mc-bench-master-", suffix=".log")
        self.process = None

    @property
    def address(self):
        return f"127.0.0.1:{self.rpc_port}"

    def __enter__(self):
        try:
            self.process = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT)
        except OSError as e:
            raise BenchError(f"cannot start {self.args[0]}: {e}") from e
        up = wait_until(lambda: self.process.poll() is not None or port_accepts(self.rpc_port),
                        MASTER_START_TIMEOUT_S)
        if not up or self.process.poll() is not None:
            tail = self.log_tail()
            self.__exit__(None, None, None)
            raise BenchError(f"mooncake_master did not come up: {shlex.join(self.args)}\n{tail}")
        return self

    def log_tail(self, n=4000):
        with open(self.log.name, "rb") as f:
            return f.read()[-n:].decode(errors="replace")

    def __exit__(self, *exc):
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=MASTER_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=MASTER_STOP_TIMEOUT_S)
        self.log.close()


# --- the C API through ctypes --------------------------------------------------------------


class SetupConfig(ctypes.Structure):
    """``mc_setup_config_t`` of include/mooncake_rs.h (field order matters)."""

    _fields_ = [
        ("local_hostname", ctypes.c_char_p),
        ("metadata_server", ctypes.c_char_p),
        ("global_segment_size", ctypes.c_uint64),
        ("local_buffer_size", ctypes.c_uint64),
        ("protocol", ctypes.c_char_p),
        ("device_name", ctypes.c_char_p),
        ("master_server_addr", ctypes.c_char_p),
    ]


def load_c_api(path):
    """Loads libmooncake_rs and declares the functions the benchmark calls."""
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise BenchError(f"cannot load the C library {path}: {e}") from e
    store, size, i64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64
    signatures = {
        "mc_version": (ctypes.c_char_p, []),
        "mc_strerror": (ctypes.c_char_p, [i64]),
        "mc_last_error_message": (size, [ctypes.c_char_p, size]),
        "mc_setup_config_init": (None, [ctypes.POINTER(SetupConfig)]),
        "mc_store_new": (store, []),
        "mc_store_setup": (ctypes.c_int, [store, ctypes.POINTER(SetupConfig)]),
        "mc_store_register_buffer": (ctypes.c_int, [store, ctypes.c_void_p, size]),
        "mc_store_get_into": (i64, [store, ctypes.c_char_p, ctypes.c_void_p, size]),
        "mc_store_batch_get_into": (ctypes.c_int, [
            store, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_void_p),
            ctypes.POINTER(size), size, ctypes.POINTER(i64)]),
        "mc_store_free": (None, [store]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


class CReader:
    """A reader store through the C API: ``mc_store_new`` + ``mc_store_setup`` with no
    segment. A context manager; ``mc_store_free`` (teardown and release) at exit. Not
    thread-safe as used here (one benchmark thread)."""

    def __init__(self, lib, master_address):
        self.lib = lib
        handle = lib.mc_store_new()
        if not handle:
            raise BenchError("mc_store_new returned NULL")
        self.handle = ctypes.c_void_p(handle)
        cfg = SetupConfig()
        lib.mc_setup_config_init(ctypes.byref(cfg))
        cfg.local_hostname = f"127.0.0.1:{free_port()}".encode()
        cfg.metadata_server = b"P2PHANDSHAKE"
        cfg.global_segment_size = 0
        cfg.local_buffer_size = READER_LOCAL_BUFFER_SIZE
        cfg.protocol = b"tcp"
        cfg.device_name = b""
        cfg.master_server_addr = master_address.encode()
        self.check("mc_store_setup", lib.mc_store_setup(self.handle, ctypes.byref(cfg)))

    def check(self, what, rc):
        if rc < 0:
            detail = ctypes.create_string_buffer(1024)
            self.lib.mc_last_error_message(detail, len(detail))
            raise BenchError(f"{what} returned {rc} ({self.lib.mc_strerror(rc).decode()}): "
                             f"{detail.value.decode(errors='replace')}")

    def register(self, array):
        self.check("mc_store_register_buffer",
                   self.lib.mc_store_register_buffer(self.handle, array.ctypes.data, array.nbytes))

    def get_into_op(self, key, array):
        """One ``mc_store_get_into`` of ``key`` into ``array``; True when it read the whole
        array (the object size). Arguments converted once here."""
        fn, handle, ckey = self.lib.mc_store_get_into, self.handle, key.encode()
        ptr, size = ctypes.c_void_p(array.ctypes.data), array.nbytes
        return lambda: fn(handle, ckey, ptr, size) == size

    def batch_get_into_op(self, keys, array):
        """One ``mc_store_batch_get_into`` of ``keys`` into consecutive equal slots of
        ``array``; True when every key read its whole slot."""
        n, slot = len(keys), array.nbytes // len(keys)
        ckeys = (ctypes.c_char_p * n)(*[k.encode() for k in keys])
        bufs = (ctypes.c_void_p * n)(*[array.ctypes.data + i * slot for i in range(n)])
        sizes = (ctypes.c_size_t * n)(*[slot] * n)
        results = (ctypes.c_int64 * n)()
        expected = bytes((ctypes.c_int64 * n)(*[slot] * n))
        fn, handle = self.lib.mc_store_batch_get_into, self.handle
        return lambda: fn(handle, ckeys, bufs, sizes, n, results) == 0 and \
            bytes(results) == expected

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.lib.mc_store_free(self.handle)


# --- the Python module ------------------------------------------------------------------


class PyStore:
    """A ``MooncakeDistributedStore`` set up with the 7 positional arguments; a context
    manager that closes it (the benchmark's readers have ``segment`` 0)."""

    def __init__(self, module, master_address, segment, local_buffer):
        self.store = module.MooncakeDistributedStore()
        rc = self.store.setup(f"127.0.0.1:{free_port()}", "P2PHANDSHAKE", segment, local_buffer,
                              "tcp", "", master_address)
        if rc != 0:
            raise BenchError(f"MooncakeDistributedStore.setup returned {rc}")

    def register(self, array):
        rc = self.store.register_buffer(array.ctypes.data, array.nbytes)
        if rc != 0:
            raise BenchError(f"register_buffer returned {rc}")

    def get_into_op(self, key, array):
        """As :meth:`CReader.get_into_op`, through ``get_into``."""
        fn, ptr, size = self.store.get_into, array.ctypes.data, array.nbytes
        return lambda: fn(key, ptr, size) == size

    def batch_get_into_op(self, keys, array):
        """As :meth:`CReader.batch_get_into_op`, through ``batch_get_into`` (Python lists,
        converted by the module on every call)."""
        n, slot = len(keys), array.nbytes // len(keys)
        ptrs = [array.ctypes.data + i * slot for i in range(n)]
        sizes = [slot] * n
        expected = [slot] * n
        fn = self.store.batch_get_into
        return lambda: fn(keys, ptrs, sizes) == expected

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.store.close()


# --- the owner, in a process of its own ----------------------------------------------

OWNER_PROGRAM = r"""
import sys
import mooncake.store as m
address, segment, local = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
store = m.MooncakeDistributedStore()
rc = store.setup("127.0.0.1", "P2PHANDSHAKE", segment, local, "tcp", "", address)
print(rc, flush=True)
for line in sys.stdin.buffer:
    key, size = line.decode().split()
    value = sys.stdin.buffer.read(int(size))
    print(store.put(key, value), flush=True)
store.close()
"""


class OwnerProcess:
    """The owner of the objects in a separate process (a Python store with a segment), so
    neither reader shares a library copy, threads or the GIL with it; a context manager that
    stops it."""

    def __init__(self, master_address, segment, local_buffer):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", OWNER_PROGRAM, master_address, str(segment), str(local_buffer)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.expect("owner setup")

    def expect(self, what):
        line = self.proc.stdout.readline().decode().strip()
        if line != "0":
            raise BenchError(f"{what} returned {line or 'nothing (owner exited)'}")

    def put(self, key, array):
        data = array.tobytes()
        self.proc.stdin.write(f"{key} {len(data)}\n".encode() + data)
        self.proc.stdin.flush()
        self.expect(f"owner put({key!r})")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=MASTER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# --- measuring ------------------------------------------------------------------------


@dataclass
class Scenario:
    name: str
    object_size: int
    count: int
    target: float

    @property
    def bytes_per_op(self):
        return self.object_size * self.count


SCENARIOS = [
    Scenario("get_into 4 MiB", 4 * MIB, 1, 0.95),
    Scenario("batch_get_into 32 x 4 KiB", 4 * KIB, 32, 0.8),
]
ENGINE_SCENARIOS = [
    Scenario("transfer_sync_write 4 MiB", 4 * MIB, 1, 0.95),
    Scenario("batch write 64 x 64 KiB", 64 * KIB, 64, 0.95),
]
# Transfers per call of the Rust side (TransferEngine._transfer_repeat).
ENGINE_REPEAT = 8


@dataclass
class Side:
    """One reader's rounds: (ops, seconds) each."""

    label: str
    rounds: list = field(default_factory=list)

    def ops_per_s(self):
        return [ops / secs for ops, secs in self.rounds]

    def summary(self, bytes_per_op):
        rates = self.ops_per_s()
        return {
            "rounds_ops_per_s": rates,
            "rounds_gb_per_s": [gb(r, bytes_per_op) for r in rates],
            "best_ops_per_s": max(rates),
            "median_ops_per_s": statistics.median(rates),
            "min_ops_per_s": min(rates),
            "max_ops_per_s": max(rates),
        }


def timed_round(op, duration_s, per_call=1):
    """Calls ``op`` until ``duration_s`` passed (at least once); (operations, seconds), where
    each call counts ``per_call`` operations."""
    calls = 0
    start = time.perf_counter()
    deadline = start + duration_s
    while True:
        if not op():
            raise BenchError("a timed call failed or returned a short count")
        calls += 1
        now = time.perf_counter()
        if now >= deadline:
            return calls * per_call, now - start


def verify(label, op, array, expected):
    """Zeroes ``array``, runs ``op`` once and checks every byte against ``expected``."""
    array.fill(0)
    if not op():
        raise BenchError(f"{label}: the verifying call failed or returned a short count")
    wrong = np.flatnonzero(array != expected)
    if wrong.size:
        first = int(wrong[0])
        raise BenchError(f"{label}: {wrong.size} wrong bytes, first at offset {first} "
                         f"(got {array[first]}, want {expected[first]})")


def warm_up(op):
    for _ in range(WARMUP_CALLS):
        if not op():
            raise BenchError("a warm-up call failed or returned a short count")


def gb(ops_per_s, bytes_per_op):
    """GB/s (10^9 bytes, as mc_bench) of ``ops_per_s`` calls moving ``bytes_per_op`` each."""
    return ops_per_s * bytes_per_op / 1e9


def print_round(scenario, index, label, ops, secs):
    rate = ops / secs
    print(f"  {scenario.name:<26} round {index:>2} {label:<6} {rate:>10.1f} ops/s "
          f"{gb(rate, scenario.bytes_per_op):>8.3f} GB/s  ({ops} calls in {secs:.2f} s)", flush=True)


def run_scenario(scenario, owner, readers, rounds, duration_s):
    """Puts the scenario's objects at the owner, verifies and warms each reader, then
    alternates their rounds. Returns the result dict of the scenario."""
    rng = np.random.default_rng(13)
    keys = [f"bench13-{uuid.uuid4().hex}-{i}" for i in range(scenario.count)]
    values = [rng.integers(0, 256, scenario.object_size, dtype=np.uint8) for _ in keys]
    for key, value in zip(keys, values):
        owner.put(key, value)
    expected = np.concatenate(values)
    sides, ops = [], []
    for label, reader, array in readers:
        op = (reader.get_into_op(keys[0], array) if scenario.count == 1
              else reader.batch_get_into_op(keys, array))
        verify(f"{scenario.name} ({label})", op, array, expected)
        warm_up(op)
        sides.append(Side(label))
        ops.append(op)
    for index in range(1, rounds + 1):
        for side, op in zip(sides, ops):
            side.rounds.append(timed_round(op, duration_s))
            print_round(scenario, index, side.label, *side.rounds[-1])
    return result_of(scenario, sides)


def result_of(scenario, sides):
    """Each side's summary and the ratios: of the best rounds, of the medians, and the
    median of the paired ratios (round i of python over round i of the limit -- the C API, or
    the Rust engine -- measured back to back under the same machine load), which gives the
    verdict."""
    py, c = (side.summary(scenario.bytes_per_op) for side in sides)
    paired = [p / q for p, q in zip(*(side.ops_per_s() for side in sides))]
    ratio_paired = statistics.median(paired)
    return {
        "scenario": scenario.name,
        "bytes_per_op": scenario.bytes_per_op,
        "target": scenario.target,
        "python": py,
        "limit": c,
        "ratio_best": py["best_ops_per_s"] / c["best_ops_per_s"],
        "ratio_median": py["median_ops_per_s"] / c["median_ops_per_s"],
        "ratios_paired": paired,
        "ratio_paired_median": ratio_paired,
        "verdict": "PASS" if ratio_paired >= scenario.target else "BELOW",
    }


def run_engine_scenario(scenario, initiator, segment, src, dst, rounds, duration_s):
    """One TransferEngine scenario: the Python call against ``ENGINE_REPEAT`` of the same
    transfers inside the Rust engine, verified once each, alternating rounds."""
    from mooncake.engine import Write

    size, count = scenario.object_size, scenario.count
    srcs = [src.ctypes.data + i * size for i in range(count)]
    dsts = [dst.ctypes.data + i * size for i in range(count)]
    lens = [size] * count
    n = scenario.bytes_per_op
    if count == 1:
        def py_op():
            return initiator.transfer_sync_write(segment, srcs[0], dsts[0], size) == 0
    else:
        def py_op():
            return initiator.batch_transfer_sync_write(segment, srcs, dsts, lens) == 0

    def rust_op():
        return initiator._transfer_repeat(segment, srcs, dsts, lens, Write, ENGINE_REPEAT) == 0

    sides = []
    for label, op, per_call in (("python", py_op, 1), ("rust", rust_op, ENGINE_REPEAT)):
        verify(f"{scenario.name} ({label})", op, dst[:n], src[:n])
        warm_up(op)
        sides.append((Side(label), op, per_call))
    for index in range(1, rounds + 1):
        for side, op, per_call in sides:
            side.rounds.append(timed_round(op, duration_s, per_call))
            print_round(scenario, index, side.label, *side.rounds[-1])
    return result_of(scenario, [side for side, _, _ in sides])


def run_engine(args, command):
    """The ``--engine`` run: two engines of this process, TCP on 127.0.0.1."""
    TransferEngine = import_installed("mooncake.engine").TransferEngine
    rounds, duration_s = QUICK if args.quick else FULL
    facts = {
        "nproc": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    print("command:", command)
    print("machine:", " ".join(f"{k}={v}" for k, v in facts.items()))
    print(f"plan: {rounds} rounds per side, {duration_s} s each, alternating python, rust "
          f"({ENGINE_REPEAT} transfers per call)", flush=True)
    target, initiator = TransferEngine(), TransferEngine()
    for engine in (target, initiator):
        if engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
            raise BenchError("TransferEngine.initialize failed")
    size = max(s.bytes_per_op for s in ENGINE_SCENARIOS)
    src = np.random.default_rng(34).integers(0, 256, size, dtype=np.uint8)
    dst = np.zeros(size, dtype=np.uint8)
    if initiator.register_memory(src.ctypes.data, size) != 0 or \
            target.register_memory(dst.ctypes.data, size) != 0:
        raise BenchError("register_memory failed")
    segment = target.get_local_segment_name()
    results = [run_engine_scenario(s, initiator, segment, src, dst, rounds, duration_s)
               for s in ENGINE_SCENARIOS]
    facts["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    print_summary(results, limit="rust")
    print("machine at end: loadavg_1m", facts["loadavg_1m_end"])
    if args.json:
        print(json.dumps({"command": command, "machine": facts,
                          "rounds": rounds, "round_s": duration_s, "results": results}))


def print_summary(results, limit="C"):
    print()
    print(f"{'scenario':<26} {'side':<6} {'best ops/s':>11} {'GB/s':>7} {'median ops/s':>13} "
          f"{'GB/s':>7} {'spread ops/s (min..max)':>25}")
    for r in results:
        for label, key in (("python", "python"), (limit, "limit")):
            s, per_op = r[key], r["bytes_per_op"]
            spread = f"{s['min_ops_per_s']:.1f}..{s['max_ops_per_s']:.1f}"
            print(f"{r['scenario']:<26} {label:<6} {s['best_ops_per_s']:>11.1f} "
                  f"{gb(s['best_ops_per_s'], per_op):>7.3f} {s['median_ops_per_s']:>13.1f} "
                  f"{gb(s['median_ops_per_s'], per_op):>7.3f} {spread:>25}")
    print()
    print(f"{'python/' + limit:<26} {'best':>6} {'median':>7} {'paired median':>14} "
          f"{'paired spread':>14} {'target':>7}  verdict (paired median >= target)")
    for r in results:
        spread = f"{min(r['ratios_paired']):.2f}..{max(r['ratios_paired']):.2f}"
        print(f"{r['scenario']:<26} {r['ratio_best']:>6.3f} {r['ratio_median']:>7.3f} "
              f"{r['ratio_paired_median']:>14.3f} {spread:>14} {r['target']:>7.2f}  {r['verdict']}")


# --- the run ------------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help=f"{QUICK[0]} rounds of {QUICK[1]} s per side and scenario (~20 s)")
    p.add_argument("--json", action="store_true", help="also print the results as one JSON line")
    p.add_argument("--engine", action="store_true",
                   help="measure mooncake.engine.TransferEngine against the Rust engine instead")
    p.add_argument("--master-bin", default=default_master_bin(),
                   help="mooncake_master to start (default: %(default)s)")
    p.add_argument("--lib", default=str(REPO_ROOT / "target/release/libmooncake_rs.so"),
                   help="the C library (default: %(default)s)")
    return p.parse_args(argv)


def machine_facts(lib, module):
    return {
        "nproc": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "numpy": np.__version__,
        "libmooncake_rs": lib.mc_version().decode(),
        "mooncake.store": getattr(module, "__file__", "?"),
    }


def import_installed(name):
    """Module ``name`` of the installed package: python/mooncake (the sources, without the
    built extension) beside this script would shadow it, so this directory leaves sys.path."""
    import importlib

    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(here)]
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise BenchError(f"cannot import {name}: {e}") from e


def run(args, command):
    module = import_installed("mooncake.store")
    lib = load_c_api(args.lib)
    rounds, duration_s = QUICK if args.quick else FULL
    facts = machine_facts(lib, module)
    print("command:", command)
    print("machine:", " ".join(f"{k}={v}" for k, v in facts.items()))
    print(f"plan: {rounds} rounds per side, {duration_s} s each, alternating python, C; "
          f"master {args.master_bin}; C library {args.lib}", flush=True)
    with Master(args.master_bin) as master, \
            OwnerProcess(master.address, OWNER_SEGMENT_SIZE, OWNER_LOCAL_BUFFER_SIZE) as owner, \
            PyStore(module, master.address, 0, READER_LOCAL_BUFFER_SIZE) as py_reader, \
            CReader(lib, master.address) as c_reader:
        results, registered = [], []  # registered arrays live until the readers close
        for scenario in SCENARIOS:
            arrays = [np.zeros(scenario.bytes_per_op, dtype=np.uint8) for _ in range(2)]
            for reader, array in zip((py_reader, c_reader), arrays):
                reader.register(array)
            registered.extend(arrays)
            readers = [("python", py_reader, arrays[0]), ("C", c_reader, arrays[1])]
            results.append(run_scenario(scenario, owner, readers, rounds, duration_s))
    facts["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    print_summary(results)
    print("machine at end: loadavg_1m", facts["loadavg_1m_end"])
    if args.json:
        print(json.dumps({"command": command, "machine": facts,
                          "rounds": rounds, "round_s": duration_s, "results": results}))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        command = shlex.join([sys.executable, sys.argv[0]] + argv)
        (run_engine if args.engine else run)(args, command)
    except BenchError as e:
        print(f"bench.py: FAILED: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
