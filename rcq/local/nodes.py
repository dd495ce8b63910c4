"""One node of a loopback cluster: its ports, its files and its ``python -m rcq serve`` process.

A :class:`LocalNode` is a node's fixed identity (id, HTTP and Raft ports, directory; stable
across restarts) plus the process running it now, if any. Its methods are the process
mechanics: start it in its own session with its output appended to its log file, signal its
whole process group (so kill -9, SIGSTOP and SIGCONT reach it and anything it forked, and
nothing else), stop it, forget it. Also here: free loopback ports, files only their owner
may read, the tail of a log.

What a cluster does with its nodes (configs, the manifest, heal, close) is
:mod:`rcq.local.cluster`; what nodes say over HTTP and the waits on it is
:mod:`rcq.local.polls`.

Must not import: rcq.server (a node is a separate process), pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import random
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from rcq.local.releases import Release

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
STOP_TIMEOUT_S = 10.0  # SIGTERM, then SIGKILL after this
LOG_TAIL_BYTES = 6_000
STACK_DUMP_WAIT_S = 1.0  # for a node to write its threads' stacks (SIGUSR1) before it is killed
STACK_DUMP_TAIL_BYTES = 12_000
# Variables ``rcq serve`` would read (the secret, an extra admin token) that the node's config
# file decides instead: a node must not take them from whoever started the harness.
CONFIG_DECIDES = frozenset({"RCQ_CLUSTER_SECRET", "RCQ_ADMIN_TOKEN"})


# ------------------------------------------------------------------ free ports
# Ports a node will bind later are picked below the kernel's ephemeral range: a port in it that
# nothing listens on yet may be handed to any outgoing connection (a Raft dial, a proxy's,
# another test's) before the node binds it, and the node then fails with "address already in
# use" (seen once in a CI run). Below the range, only a process binding that very port can take it.
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOW_PORTS_MIN = 10_000  # well above the ports services usually claim (databases, brokers below 10000)
LOW_PORTS_MIN_SPAN = 2_000  # fewer ports than this below the range: bind port 0 instead
# "K/N": pick only in the K-th (from 0) of N equal slices of those low ports. Processes that start
# clusters side by side (the test suite's parallel workers) each take their own slice, so that a
# port one of them picked and released is never picked by another before its node binds it.
# Children inherit it (a launcher's nodes pick in their parent's slice).
PORT_SLICE_ENV = "RCQ_LOCAL_PORT_SLICE"
PORT_SLICE_MIN = 500  # ports in a slice, at least: a cluster test takes a few dozen at a time
# A port handed out is not bound by its user at once (a config is written first, a node started
# later), so calls one after another could pick the same one (seen in a CI run: two peers of one
# test's config on one port). The last ports handed out in this process are never picked again.
_handed_out: collections.deque[int] = collections.deque(maxlen=PORT_SLICE_MIN // 2)


def ephemeral_low(range_file: Path = EPHEMERAL_RANGE_FILE) -> int | None:
    """The first port of the kernel's ephemeral range (None: not known on this system)."""
    try:
        return int(range_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def port_slice(value: str) -> tuple[int, int]:
    """``"K/N"`` (``$RCQ_LOCAL_PORT_SLICE``) as (K, N), 0 <= K < N; ValueError saying what is wrong."""
    try:
        index_text, count_text = value.split("/")
        index, count = int(index_text), int(count_text)
    except ValueError:
        raise ValueError(f"{PORT_SLICE_ENV}={value!r}: expected K/N, e.g. 0/4") from None
    if not 0 <= index < count:
        raise ValueError(f"{PORT_SLICE_ENV}={value!r}: K must be at least 0 and less than N")
    return index, count


def low_ports(range_file: Path = EPHEMERAL_RANGE_FILE, slice_text: str | None = None) -> range | None:
    """The ports :func:`free_ports` picks from: those below the ephemeral range (None when it leaves
    too few below it), narrowed to this process's slice (``slice_text``, by default
    ``$RCQ_LOCAL_PORT_SLICE``)."""
    low = ephemeral_low(range_file)
    if low is None or low - LOW_PORTS_MIN < LOW_PORTS_MIN_SPAN:
        return None
    ports = range(LOW_PORTS_MIN, low)
    slice_text = os.environ.get(PORT_SLICE_ENV) if slice_text is None else slice_text
    if not slice_text:
        return ports
    index, count = port_slice(slice_text)
    size = len(ports) // count
    if size < PORT_SLICE_MIN:
        raise ValueError(f"{PORT_SLICE_ENV}={slice_text!r}: {count} slices of {len(ports)} ports leave fewer "
                         f"than {PORT_SLICE_MIN} in each")
    return ports[index * size:(index + 1) * size]


def free_ports(count: int, range_file: Path = EPHEMERAL_RANGE_FILE) -> list[int]:
    """``count`` distinct loopback ports nothing listens on, all bound at once while picked (so no
    repeats), below the ephemeral range when it leaves room (else ports the OS picks), in this
    process's slice of them (:data:`PORT_SLICE_ENV`), none of the last ones this process handed out."""
    ports = _pick_ports(count, range_file)
    _handed_out.extend(ports)
    return ports


def _pick_ports(count: int, range_file: Path) -> list[int]:
    candidates = low_ports(range_file)
    recent = set(_handed_out)
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        if candidates is not None:
            for port in random.sample(candidates, min(len(candidates), 50 * count + 100)):
                if port in recent:
                    continue
                sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                try:
                    sock.bind((HOST, port))
                except OSError:
                    continue
                ports.append(port)
                if len(ports) == count:
                    return ports
        while len(ports) < count:
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((HOST, 0))
            port = sock.getsockname()[1]
            if port not in recent:
                ports.append(port)
        return ports


def free_port_range(size: int, range_file: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """``size`` consecutive loopback ports nothing listens on, as (first, last), picked as
    :func:`free_ports` picks (below the ephemeral range, in this process's slice, none handed out
    lately): a node's ``partition_ports``."""
    candidates = low_ports(range_file)
    if candidates is None or len(candidates) < 4 * size:
        raise OSError(f"no room below the ephemeral range for {size} consecutive ports")
    recent = set(_handed_out)
    for start in random.sample(candidates[:len(candidates) - size], min(len(candidates) - size, 200)):
        ports = range(start, start + size)
        if recent.intersection(ports):
            continue
        with contextlib.ExitStack() as stack:
            try:
                for port in ports:
                    stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)).bind((HOST, port))
            except OSError:
                continue
        _handed_out.extend(ports)
        return start, start + size - 1
    raise OSError(f"found no {size} consecutive free ports in 200 tries")


def check_ports_free(ports: Iterable[int]) -> None:
    """Raise OSError naming the first port something listens on (TIME_WAIT leftovers are fine:
    the nodes bind with SO_REUSEADDR too)."""
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((HOST, port))
            except OSError as exc:
                raise OSError(f"port {HOST}:{port} is not free: {exc}") from exc


# ------------------------------------------------------------------ files
def read_tail(path: Path, tail_bytes: int = LOG_TAIL_BYTES) -> str:
    """The last ``tail_bytes`` of a log file, without reading the whole file."""
    try:
        with open(path, "rb") as log_file:
            log_file.seek(0, os.SEEK_END)
            size = log_file.tell()
            log_file.seek(max(0, size - tail_bytes))
            text = log_file.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return "(no log yet)"
    return ("...\n" if size > tail_bytes else "") + text


# ------------------------------------------------------------------ a node
@dataclasses.dataclass
class LocalNode:
    """One node's fixed identity (stable across restarts) and its current process.

    A node is *live* when its process runs and is not paused: only live nodes are polled.
    """

    index: int
    node_id: str
    http_port: int
    raft_port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    starts: int = 0
    nofile_limit: int | None = None  # RLIMIT_NOFILE soft limit its process starts with (None: inherited)
    tls: bool = False  # it serves HTTPS
    # The release it runs (rcq.local.releases): None, the code under test (this interpreter's rcq).
    release: Release | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def url(self) -> str:
        """Its own HTTP port (what the harness polls; clients may be given another URL)."""
        return f"{self.scheme}://{HOST}:{self.http_port}"

    @property
    def raft_address(self) -> str:
        return f"{HOST}:{self.raft_port}"

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def config_path(self) -> Path:
        return self.directory / "config.json"

    @property
    def tokens_path(self) -> Path:
        return self.directory / "tokens.json"

    @property
    def log_path(self) -> Path:
        return self.directory / "node.log"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def running(self) -> bool:
        """Its process exists and has not exited (it may be paused)."""
        return self.process is not None and self.process.poll() is None

    def live(self) -> bool:
        return self.running() and not self.paused

    def describe(self) -> str:
        runs = "" if self.release is None else f"release {self.release.name}, "
        if self.process is None:
            return runs + "stopped"
        code = self.process.poll()
        if code is not None:
            return f"{runs}exited with {code}"
        return f"{runs}pid {self.process.pid}" + (" paused" if self.paused else "")

    # ------------------------------------------------------------ process
    def rcq_argv(self) -> list[str]:
        """``python -m rcq`` of the release it runs (of the code under test without one)."""
        return [sys.executable, "-m", "rcq"] if self.release is None else self.release.rcq_argv()

    def spawn(self, log_level: str) -> int:
        """Start ``python -m rcq serve`` (of its release, if it has one) on its config file; returns the pid."""
        if self.running():
            raise RuntimeError(f"{self.node_id} is already running ({self.describe()})")
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        env = {k: v for k, v in os.environ.items() if k not in CONFIG_DECIDES}
        if self.release is not None:
            env = self.release.environment(env)
        env["PYTHONUNBUFFERED"] = "1"
        with open(self.log_path, "ab") as log_file:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            runs = "" if self.release is None else f" (release {self.release.name}, {self.release.commit[:12]})"
            log_file.write(f"===== {stamp} start #{self.starts + 1} of {self.node_id}{runs} =====\n".encode())
            log_file.flush()
            # Its own session: a signal sent to the test runner or the launcher's terminal never
            # reaches it, and its process group holds exactly it and what it forks.
            self.process = subprocess.Popen(
                [*self.rcq_argv(), "serve", "--config", str(self.config_path), "--log-level", log_level],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                start_new_session=True, env=env, cwd=self.directory,
                preexec_fn=None if self.nofile_limit is None else self._lower_nofile_limit)
        self.paused = False
        self.starts += 1
        log.debug("started %s pid %d", self.node_id, self.process.pid)
        return self.process.pid

    def _lower_nofile_limit(self) -> None:
        """preexec_fn: runs in the child between fork and exec, so no locks, no logging: two syscalls."""
        assert self.nofile_limit is not None
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile_limit, hard))

    def _stacks_and_log_tail(self) -> str:
        """SIGUSR1 (rcq serve dumps every thread's stack into its log on it), a moment for the dump to
        land, then the log's last lines: what a stop that hung leaves behind, once the data dir is gone."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGUSR1)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(STACK_DUMP_WAIT_S)  # it may finish stopping meanwhile: nothing is lost
        return read_tail(self.log_path, STACK_DUMP_TAIL_BYTES)

    def signal_group(self, signum: signal.Signals) -> None:
        # The node leads its own session and process group, so the group id is its pid.
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signum)

    def pause(self) -> None:
        """SIGSTOP: it keeps its sockets but answers nothing until resumed."""
        if not self.running():
            raise RuntimeError(f"{self.node_id} is not running ({self.describe()})")
        self.signal_group(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        if self.running():
            self.signal_group(signal.SIGCONT)
        self.paused = False

    def kill(self) -> int | None:
        """SIGKILL it and anything it forked, as a crash would; returns its exit code."""
        if self.process is None:
            return None
        self.signal_group(signal.SIGKILL)
        self.process.wait(STOP_TIMEOUT_S)
        return self.forget()

    def request_stop(self) -> None:
        """SIGTERM, without waiting (so a cluster's nodes shut down in parallel)."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        if self.paused:  # a stopped process would hold SIGTERM until continued
            self.resume()
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)

    def finish_stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """Wait up to ``timeout_s`` for it to exit, SIGKILL it if it has not; returns its exit code."""
        if self.process is None:
            return None
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("%s ignored SIGTERM for %.1f s; killing it. Its threads' stacks, then the end of its "
                        "log:\n%s", self.node_id, timeout_s, self._stacks_and_log_tail())
        self.signal_group(signal.SIGKILL)  # also a forked snapshot writer, which must not outlive it
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(STOP_TIMEOUT_S)
        return self.forget()

    def forget(self) -> int | None:
        """Drop the process (it has exited); returns its exit code."""
        code = self.process.returncode if self.process is not None else None
        self.process = None
        self.paused = False
        return code
