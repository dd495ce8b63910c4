"""SparkStandalone: a Spark standalone cluster on loopback — one master and one worker, each its own JVM.

``local[N]`` runs the driver and the executors in one JVM, so it never shows what a deployment
adds: executors in other processes that unpickle the connector and run their own Python
workers, and an executor that dies while the driver carries on. This harness starts such a
cluster from the ``pyspark`` package itself (its ``bin/spark-class`` and jars; nothing is
downloaded)::

    with SparkStandalone(cores=2, memory="1g") as cluster:
        spark = SparkSession.builder.config(map=cluster.session_config()).getOrCreate()
        ...
        executor = cluster.executors(spark.sparkContext.applicationId)[0]
        cluster.kill_executor(executor)             # SIGKILL, as a crash would
        cluster.wait_for_executor(spark.sparkContext.applicationId, exclude={executor.pid})

``org.apache.spark.deploy.master.Master`` and ``org.apache.spark.deploy.worker.Worker`` run
as two processes, each in its own session (so a signal to the caller's terminal reaches
neither, and each process group holds one daemon and what it starts), bound to 127.0.0.1 on
free ports, with its own log file. Starting waits, with a deadline, until the master's web UI
JSON lists the worker ALIVE; a daemon that exits meanwhile fails the start with its log tail.

The worker starts each application's executor as a child JVM
(``CoarseGrainedExecutorBackend``), which forks Python workers with the interpreter the
driver names (:meth:`session_config` names ``python``, by default this one, so ``rcq``
imports there). :meth:`executors` finds the executor JVMs in ``/proc`` (Linux), :meth:`executor_of`
the one a process (a Python worker) runs under; :meth:`kill_executor` SIGKILLs one, after
which the worker starts a replacement for the application.

:meth:`close` SIGTERMs both daemons (the worker stops its executors), waits, SIGKILLs what is
left of their process groups and of every process tree seen under them (Python workers leave
the groups), and removes the temporary directory. Layout of ``base_dir``::

    conf/spark-defaults.conf   what the daemons read: no REST server, no port retries (a port
                               taken between choosing and binding fails the start, it does not
                               silently move the master elsewhere)
    master.log, worker.log     each daemon's stdout and stderr
    work/<app>/<executor>/     each executor's directory: its stdout and stderr

Used by ``python -m bench.spark --standalone``, the Spark example's ``--standalone`` and the
Spark tests (tests/spark); it lives here, beside the bench, because the bench is its one user
outside the tests.

Must not import: pyspark (the driver is the caller's; the harness needs only its files),
rcq.server.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Self

from bench.proc_table import Process, alive, cmdline, descendants, processes, read_process
from rcq.local.nodes import HOST, LOG_TAIL_BYTES, STOP_TIMEOUT_S, free_ports, read_tail
from rcq.local.polls import deadline_loop, http_json
from rcq.local.waits import wait_until

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0  # two JVMs starting on a busy 2-core machine
EXECUTOR_TIMEOUT_S = 120.0  # a replacement executor: the worker notices the loss, the master asks for a new one
POLL_INTERVAL_S = 0.2
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASSES = ("org.apache.spark.executor.CoarseGrainedExecutorBackend",
                    "org.apache.spark.executor.YarnCoarseGrainedExecutorBackend")
DAEMON_JAVA_OPTS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"  # two mostly idle JVMs: few threads, cheap JIT
DAEMON_DEFAULTS = {
    "spark.master.rest.enabled": "false",
    "spark.port.maxRetries": "0",
    "spark.ui.showConsoleProgress": "false",
}


class SparkStandaloneError(RuntimeError):
    """The standalone cluster could not start, or a daemon died (its log tail is in the message)."""


@dataclasses.dataclass(frozen=True)
class Executor:
    """One executor JVM of an application, as the worker started it."""

    pid: int
    app_id: str
    executor_id: str


def spark_home() -> Path:
    """Where Spark's ``bin`` and ``jars`` are: ``$SPARK_HOME`` if set (as pyspark itself decides),
    else the installed pyspark package, which ships both."""
    configured = os.environ.get("SPARK_HOME")
    if configured and (Path(configured) / "bin" / "spark-class").exists():
        return Path(configured)
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise SparkStandaloneError("pyspark is not installed: pip install 'rcq[spark]'")
    home = Path(next(iter(spec.submodule_search_locations)))
    if not (home / "bin" / "spark-class").exists():
        raise SparkStandaloneError(f"{home} has no bin/spark-class: set SPARK_HOME to a Spark distribution")
    return home


def _argument(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv[:-1] else None


class SparkStandalone:
    """A master and one worker (``cores`` cores, ``memory`` for executors) on 127.0.0.1.

    ``python``: the interpreter the executors' Python workers run (default: this one).
    ``base_dir`` None: a fresh temporary directory, removed by :meth:`close` unless ``keep``.
    ``env``: more variables for the daemons and, through the worker, the executors.
    """

    def __init__(self, cores: int = 2, memory: str = "1g", *, python: str = sys.executable,
                 base_dir: Path | None = None, keep: bool = False, daemon_memory: str = "256m",
                 env: dict[str, str] | None = None, start_timeout_s: float = START_TIMEOUT_S) -> None:
        if cores < 1:
            raise ValueError("cores must be at least 1")
        self.cores = cores
        self.memory = memory
        self.python = python
        self.daemon_memory = daemon_memory
        self.extra_env = dict(env or {})
        self.start_timeout_s = start_timeout_s
        self.spark_home = spark_home()
        self.master_port, self.master_ui_port, self.worker_port, self.worker_ui_port = free_ports(4)
        self._owns_dir = base_dir is None
        self.keep = keep
        self.base_dir = Path(tempfile.mkdtemp(prefix="rcq-spark-standalone-")) if base_dir is None else Path(base_dir)
        self.master: subprocess.Popen[bytes] | None = None
        self.worker: subprocess.Popen[bytes] | None = None
        self._seen: dict[int, Process] = {}  # every process seen under the daemons or a killed executor
        self._closed = False

    # ------------------------------------------------------------- views
    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.master_port}"

    @property
    def ui_url(self) -> str:
        """The master's web UI; ``/json/`` is its state: workers, applications."""
        return f"http://{HOST}:{self.master_ui_port}"

    @property
    def work_dir(self) -> Path:
        return self.base_dir / "work"

    @property
    def conf_dir(self) -> Path:
        return self.base_dir / "conf"

    def log_path(self, daemon: str) -> Path:
        return self.base_dir / f"{daemon}.log"

    def state(self) -> dict[str, Any]:
        """The master's view (``/json/``): ``workers`` (with ``state``), ``activeapps``, ``status``."""
        return http_json(self.ui_url + "/json/", timeout_s=5.0)

    def session_config(self) -> dict[str, str]:
        """What a driver in this process needs to run on the cluster: ``SparkSession.builder.config(map=...)``.
        One executor takes the whole worker, so a replacement fits only once a lost one is gone."""
        return {
            "spark.master": self.master_url,
            "spark.pyspark.python": self.python,
            "spark.driver.host": HOST,
            "spark.driver.bindAddress": HOST,
            "spark.executor.cores": str(self.cores),
            "spark.cores.max": str(self.cores),
            "spark.executor.memory": self.memory,
        }

    # ------------------------------------------------------------ lifecycle
    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> None:
        """Start the master and the worker (in parallel: the worker retries until the master listens)
        and wait until the master lists the worker ALIVE."""
        if self._closed:
            raise RuntimeError("the standalone cluster is closed")
        self.base_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.conf_dir.mkdir(exist_ok=True)
        self.work_dir.mkdir(exist_ok=True)
        (self.conf_dir / "spark-defaults.conf").write_text("".join(f"{k} {v}\n" for k, v in DAEMON_DEFAULTS.items()))
        self.master = self._spawn("master", MASTER_CLASS, "--host", HOST, "--port", str(self.master_port),
                                  "--webui-port", str(self.master_ui_port))
        self.worker = self._spawn("worker", WORKER_CLASS, self.master_url, "--host", HOST,
                                  "--port", str(self.worker_port), "--webui-port", str(self.worker_ui_port),
                                  "--cores", str(self.cores), "--memory", self.memory, "--work-dir", str(self.work_dir))
        self._wait_for_worker()

    def _env(self) -> dict[str, str]:
        # Nothing of the caller's own Spark setup: this cluster's home, conf, loopback and interpreter only.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
        env.update(SPARK_HOME=str(self.spark_home), SPARK_CONF_DIR=str(self.conf_dir), SPARK_LOCAL_IP=HOST,
                   SPARK_LOCAL_HOSTNAME=HOST, SPARK_DAEMON_MEMORY=self.daemon_memory,
                   SPARK_DAEMON_JAVA_OPTS=DAEMON_JAVA_OPTS, PYSPARK_PYTHON=self.python)
        env.update(self.extra_env)
        return env

    def _spawn(self, name: str, main_class: str, *args: str) -> subprocess.Popen[bytes]:
        with open(self.log_path(name), "ab") as log_file:
            process = subprocess.Popen([str(self.spark_home / "bin" / "spark-class"), main_class, *args],
                                       stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                       start_new_session=True, env=self._env(), cwd=self.base_dir)
        log.debug("started the Spark %s, pid %d", name, process.pid)
        return process

    def _daemons(self) -> dict[str, subprocess.Popen[bytes]]:
        return {name: p for name, p in (("master", self.master), ("worker", self.worker)) if p is not None}

    def _check_daemons(self) -> None:
        for name, process in self._daemons().items():
            code = process.poll()
            if code is not None:
                raise SparkStandaloneError(f"the Spark {name} (pid {process.pid}) exited with {code}; its log "
                                           f"{self.log_path(name)}:\n{read_tail(self.log_path(name))}")

    def _wait_for_worker(self) -> None:
        last: object = "no answer yet"
        for _ in deadline_loop(self.start_timeout_s, POLL_INTERVAL_S):
            self._check_daemons()
            try:
                state = self.state()
            except (OSError, ValueError) as exc:  # the master's UI is not up yet
                last = exc
                continue
            workers = state.get("workers", [])
            last = [(w.get("host"), w.get("port"), w.get("state")) for w in workers]
            if any(w.get("state") == "ALIVE" and w.get("port") == self.worker_port for w in workers):
                return
        raise SparkStandaloneError(f"the worker was not ALIVE at the master within {self.start_timeout_s} s "
                                   f"(last seen: {last});\n{self.dump_logs()}")

    def close(self) -> None:
        """Stop both daemons (SIGTERM, then SIGKILL), kill anything left under them, remove an owned temp dir."""
        if self._closed:
            return
        self._closed = True
        try:
            self._remember_trees()
            daemons = list(self._daemons().values())
            for process in daemons:  # the worker's shutdown stops its executors
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
            for process in daemons:
                try:
                    process.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    log.warning("the Spark daemon pid %d ignored SIGTERM for %.0f s; killing it", process.pid,
                                STOP_TIMEOUT_S)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)  # its group: executors not yet stopped
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(STOP_TIMEOUT_S)
            self._kill_remembered()
        finally:
            if self._owns_dir and not self.keep:
                shutil.rmtree(self.base_dir, ignore_errors=True)

    def _remember_trees(self, roots: Iterable[int] | None = None) -> None:
        table = processes()
        for root in (p.pid for p in self._daemons().values()) if roots is None else roots:
            for process in descendants(root, table):
                self._seen.setdefault(process.pid, process)

    def _kill_remembered(self) -> None:
        """SIGKILL every process seen under the cluster that still lives (Python workers of a lost
        executor end on their own when its pipe closes; this is for those that did not)."""
        left = [p for p in self._seen.values() if alive(p)]
        for process in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(process.pid, signal.SIGKILL)
        for _ in deadline_loop(STOP_TIMEOUT_S, POLL_INTERVAL_S):
            left = [p for p in left if alive(p)]
            if not left:
                return
        log.warning("processes %s of the Spark standalone cluster outlived SIGKILL", [p.pid for p in left])

    # ------------------------------------------------------------ executors
    def executors(self, app_id: str | None = None) -> list[Executor]:
        """The running executor JVMs the worker started (of ``app_id`` only, if given)."""
        if self.worker is None:
            return []
        found = []
        for process in descendants(self.worker.pid, processes()):
            argv = cmdline(process.pid)
            if process.state == "Z" or not any(cls in argv for cls in EXECUTOR_CLASSES):
                continue
            executor = Executor(process.pid, _argument(argv, "--app-id") or "?", _argument(argv, "--executor-id") or "?")
            if app_id is None or executor.app_id == app_id:
                found.append(executor)
        return found

    def executor_of(self, pid: int) -> Executor | None:
        """The executor JVM that ``pid`` (a Python worker, say) runs under, or is; None if none of ours."""
        ours = {e.pid: e for e in self.executors()}
        table = processes()
        seen: set[int] = set()
        while pid in table and pid not in seen:
            if pid in ours:
                return ours[pid]
            seen.add(pid)
            pid = table[pid].ppid
        return None

    def wait_for_executor(self, app_id: str, exclude: Iterable[int] = (),
                          timeout_s: float = EXECUTOR_TIMEOUT_S) -> Executor:
        """The first running executor of ``app_id`` whose pid is not in ``exclude`` (a replacement)."""
        excluded = set(exclude)

        def attempt() -> Executor | None:
            self._check_daemons()
            return next((e for e in self.executors(app_id) if e.pid not in excluded), None)

        return wait_until(attempt, timeout_s, what=f"an executor of {app_id} other than {sorted(excluded)}",
                          interval_s=POLL_INTERVAL_S)

    def kill_executor(self, executor: Executor, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGKILL one of our executor JVMs, as a crash would, and wait until it is gone. Its Python
        workers are left to notice on their own (they do, when its pipe closes); :meth:`close` kills
        any that do not."""
        if executor not in self.executors():
            raise ValueError(f"{executor} is not a running executor of this cluster")
        self._remember_trees([executor.pid])
        target = read_process(executor.pid)
        os.kill(executor.pid, signal.SIGKILL)
        if target is not None:
            wait_until(lambda: not alive(target), timeout_s, what=f"executor pid {executor.pid} gone after SIGKILL",
                       interval_s=POLL_INTERVAL_S)

    # ------------------------------------------------------------ logs
    def executor_logs(self) -> Iterator[Path]:
        yield from sorted(self.work_dir.glob("*/*/stderr"))

    def dump_logs(self, tail_bytes: int = LOG_TAIL_BYTES) -> str:
        """The tail of each daemon's log and of each executor's stderr, headed by what it is."""
        parts = []
        for name, process in (("master", self.master), ("worker", self.worker)):
            state = "not started" if process is None else (
                f"pid {process.pid}" if process.poll() is None else f"exited with {process.returncode}")
            parts.append(f"----- Spark {name} [{state}] {self.log_path(name)} -----\n"
                         + read_tail(self.log_path(name), tail_bytes))
        for path in self.executor_logs():
            parts.append(f"----- executor {path.parent.parent.name}/{path.parent.name} {path} -----\n"
                         + read_tail(path, tail_bytes))
        return "\n".join(parts)
