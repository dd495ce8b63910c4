"""The container engine docker-compose.yml runs on: Docker with its compose plugin, or Podman with podman-compose.

``choose_engine("auto")`` takes Docker only when ``docker version`` reaches an engine (its server
part) and ``docker compose version`` answers: a ``docker`` client with no engine behind it, or no
compose plugin, is not an engine. Otherwise Podman, with ``podman-compose`` (PyPI; Podman 4.3, Debian
12's, has no ``podman compose``). ``choose_engine("docker")`` / ``("podman")`` take that one or say
why not (:class:`EngineUnavailable`, whose message names every command that failed).

Podman gets a ``containers.conf`` written by the project (:func:`write_containers_conf`, pointed at
by ``CONTAINERS_CONF`` in :attr:`Engine.env`) so that it runs on hosts like a root shell in a
container or VM without CAP_SYS_RESOURCE:

* ``runtime = "runc"``: crun 1.8 refuses hosts with hybrid cgroups ("cgroups in hybrid mode not
  supported"); runc runs on cgroups v1, hybrid and v2 alike;
* ``default_ulimits``: explicit, at the current hard limits (open files; processes, at most the
  kernel's ``pid_max``). Podman's default asks for more than a process without CAP_SYS_RESOURCE may
  set (``setrlimit RLIMIT_NOFILE: Operation not permitted``), and an nproc above ``pid_max`` makes
  runc fail ("error setting rlimit").

``BUILDAH_FORMAT=docker`` is set for Podman too: the OCI image format has no HEALTHCHECK, and
Podman drops the Dockerfile's unless it builds Docker-format images.

Must not import: any rcq module (an operator's tool: it runs engines, not nodes).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import resource
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the checkout: docker-compose.yml, cluster/Dockerfile
COMPOSE_FILE = ROOT / "docker-compose.yml"
STATE_DIR = ROOT / "build" / "containers"  # what this module writes (containers.conf); git ignores build/
ENGINES = ("auto", "docker", "podman")
PROBE_TIMEOUT_S = 20.0  # `docker version`, `podman info`: an engine answers well within this
PID_MAX_FILE = Path("/proc/sys/kernel/pid_max")
NR_OPEN_FILE = Path("/proc/sys/fs/nr_open")
NOFILE_FALLBACK = 1 << 20  # open files when the hard limit is unlimited and nr_open unreadable
NPROC_FALLBACK = 32_768  # processes when neither the hard limit nor pid_max says (Linux's default pid_max)


class EngineUnavailable(RuntimeError):
    """No container engine that can run the compose cluster: the message says what was tried and why it failed."""


@dataclasses.dataclass(frozen=True)
class Engine:
    """How to run one engine: its CLI, its compose command and the environment both need."""

    name: str  # "docker" or "podman"
    cli: tuple[str, ...]  # ("docker",) / ("podman",)
    compose: tuple[str, ...]  # ("docker", "compose") / the podman-compose command
    env: Mapping[str, str]  # added to the environment of every command (CONTAINERS_CONF, BUILDAH_FORMAT)
    version: str  # the engine's server version, and compose's

    def environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """This process's environment with the engine's variables (and ``extra``) added."""
        return {**os.environ, **self.env, **(extra or {})}

    def run(self, args: Sequence[str], timeout_s: float, extra_env: Mapping[str, str] | None = None,
            check: bool = True, stdin: int | None = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
        """``cli *args`` (bounded); :class:`EngineCommandFailed` unless it exits 0 (with ``check``)."""
        return run_command([*self.cli, *args], timeout_s, self.environment(extra_env), check, stdin)

    def run_compose(self, args: Sequence[str], timeout_s: float, extra_env: Mapping[str, str] | None = None,
                    check: bool = True) -> subprocess.CompletedProcess[str]:
        return run_command([*self.compose, *args], timeout_s, self.environment(extra_env), check)


class EngineCommandFailed(RuntimeError):
    """An engine's command failed or timed out; the message names it and quotes its stderr."""


def run_command(command: Sequence[str], timeout_s: float, env: Mapping[str, str] | None = None, check: bool = True,
                stdin: int | None = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    """``command`` within ``timeout_s``; :class:`EngineCommandFailed` when it cannot run, times out,
    or (``check``) exits non-zero."""
    shown = shlex.join(command)
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout_s, check=False,
                              stdin=stdin, env=dict(env) if env is not None else None)
    except subprocess.TimeoutExpired as exc:
        raise EngineCommandFailed(f"`{shown}` timed out after {timeout_s:.0f} s") from exc
    except OSError as exc:
        raise EngineCommandFailed(f"`{shown}` could not run: {exc}") from exc
    if check and done.returncode != 0:
        stderr = (done.stderr or done.stdout or "").strip()
        raise EngineCommandFailed(f"`{shown}` exited {done.returncode}: {stderr[-2000:]}")
    return done


# ------------------------------------------------------------------ a compose project's objects
PROJECT_LABEL = "com.docker.compose.project"  # docker compose and podman-compose both set it
SERVICE_LABEL = "com.docker.compose.service"


def project_containers(engine: Engine, project: str, service: str | None = None,
                       timeout_s: float = PROBE_TIMEOUT_S) -> list[str]:
    """The ids of compose project ``project``'s containers (of ``service`` only, if given), stopped ones too."""
    filters = ["--filter", f"label={PROJECT_LABEL}={project}"]
    if service is not None:
        filters += ["--filter", f"label={SERVICE_LABEL}={service}"]
    return engine.run(["ps", "-a", "-q", *filters], timeout_s).stdout.split()


def project_leftovers(engine: Engine, project: str, timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, list[str]]:
    """What of compose project ``project`` exists: containers, volumes and networks (by its label)."""
    label = f"label={PROJECT_LABEL}={project}"
    return {"containers": project_containers(engine, project, timeout_s=timeout_s),
            "volumes": engine.run(["volume", "ls", "-q", "--filter", label], timeout_s).stdout.split(),
            "networks": engine.run(["network", "ls", "-q", "--filter", label], timeout_s).stdout.split()}


# ------------------------------------------------------------------ podman's configuration
def container_ulimits(pid_max_file: Path = PID_MAX_FILE, nr_open_file: Path = NR_OPEN_FILE) -> dict[str, int]:
    """The ulimits containers get: this process's hard limits of open files and processes (no
    higher: raising one needs CAP_SYS_RESOURCE), processes at most the kernel's pid_max."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if nofile == resource.RLIM_INFINITY:
        nofile = _read_int(nr_open_file) or NOFILE_FALLBACK
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    pid_max = _read_int(pid_max_file) or NPROC_FALLBACK
    nproc = pid_max if nproc == resource.RLIM_INFINITY else min(nproc, pid_max)
    return {"nofile": int(nofile), "nproc": int(nproc)}


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def containers_conf_text(ulimits: Mapping[str, int]) -> str:
    limits = ", ".join(f'"{name}={value}:{value}"' for name, value in sorted(ulimits.items()))
    return ("# Written by cluster/engine.py for podman (CONTAINERS_CONF): runc, and ulimits no higher than\n"
            "# this host's hard limits. Rewritten on each use; see docs/deploy.md.\n"
            "[containers]\n"
            f"default_ulimits = [{limits}]\n"
            "\n"
            "[engine]\n"
            'runtime = "runc"\n')


def write_containers_conf(state_dir: Path = STATE_DIR) -> Path:
    """``state_dir/containers.conf`` for this host (see the module docstring); its path."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "containers.conf"
    text = containers_conf_text(container_ulimits())
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def podman_env(state_dir: Path = STATE_DIR) -> dict[str, str]:
    return {"CONTAINERS_CONF": str(write_containers_conf(state_dir)), "BUILDAH_FORMAT": "docker"}


# ------------------------------------------------------------------ choosing
def podman_compose_command() -> tuple[str, ...] | None:
    """podman-compose on PATH, beside this Python (a venv not activated), or as its module; None: not installed."""
    found = shutil.which("podman-compose") or shutil.which("podman-compose", path=str(Path(sys.executable).parent))
    if found:
        return (found,)
    if importlib.util.find_spec("podman_compose") is None:
        return None
    return (sys.executable, "-m", "podman_compose")


def docker_problem() -> str | None:
    """None when Docker can run the compose cluster; otherwise why not."""
    if shutil.which("docker") is None:
        return "the docker command is not installed"
    try:
        run_command(["docker", "version", "--format", "{{.Server.Version}}"], PROBE_TIMEOUT_S)
    except EngineCommandFailed as exc:
        return f"`docker version` reaches no engine: {exc}"
    try:
        run_command(["docker", "compose", "version"], PROBE_TIMEOUT_S)
    except EngineCommandFailed as exc:
        return f"no docker compose plugin: {exc}"
    return None


def podman_problem(state_dir: Path = STATE_DIR) -> str | None:
    """None when Podman and podman-compose can run the compose cluster; otherwise why not."""
    if shutil.which("podman") is None:
        return "podman is not installed (Debian: apt-get install podman runc netavark aardvark-dns; ./run tests does)"
    if podman_compose_command() is None:
        return "podman-compose is not installed (pip install podman-compose; the test extra has it)"
    if shutil.which("runc") is None:
        return "runc is not installed (Debian: apt-get install runc): the containers.conf written here asks for it"
    try:
        run_command(["podman", "info", "--format", "{{.Host.OCIRuntime.Name}}"], PROBE_TIMEOUT_S,
                    {**os.environ, **podman_env(state_dir)})
    except EngineCommandFailed as exc:
        return f"podman does not work here: {exc}"
    return None


def _docker() -> Engine:
    server = run_command(["docker", "version", "--format", "{{.Server.Version}}"], PROBE_TIMEOUT_S).stdout.strip()
    compose = run_command(["docker", "compose", "version", "--short"], PROBE_TIMEOUT_S).stdout.strip()
    return Engine("docker", ("docker",), ("docker", "compose"), {}, f"Docker {server}, compose {compose}")


def _podman(state_dir: Path) -> Engine:
    env = podman_env(state_dir)
    compose = podman_compose_command()
    assert compose is not None  # podman_problem() said so
    version = run_command(["podman", "version", "--format", "{{.Server.Version}}"], PROBE_TIMEOUT_S,
                          {**os.environ, **env}).stdout.strip()
    compose_version = run_command([*compose, "version"], PROBE_TIMEOUT_S, {**os.environ, **env}).stdout
    compose_line = next((line for line in compose_version.splitlines() if "podman-compose" in line), "podman-compose")
    return Engine("podman", ("podman",), compose, env, f"Podman {version}, {compose_line.strip()}")


def choose_engine(wanted: str = "auto", state_dir: Path = STATE_DIR) -> Engine:
    """The engine to use (see the module docstring); :class:`EngineUnavailable` saying why not."""
    if wanted not in ENGINES:
        raise ValueError(f"engine {wanted!r}: one of {', '.join(ENGINES)}")
    problems: list[str] = []
    if wanted in ("auto", "docker"):
        problem = docker_problem()
        if problem is None:
            return _docker()
        problems.append(f"Docker: {problem}")
    if wanted in ("auto", "podman"):
        problem = podman_problem(state_dir)
        if problem is None:
            return _podman(state_dir)
        problems.append(f"Podman: {problem}")
    raise EngineUnavailable("no container engine for the compose cluster: " + "; ".join(problems))
