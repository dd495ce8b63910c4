"""docker-compose.yml's cluster for the tests: the engine it runs on, its image built once per test
process, and a compose project driven as an operator would (compose commands, the engine's CLI, curl).

The image is built once per process (:func:`node_image`): the tests that use it are marked
``fixed_ports`` (the compose file publishes 127.0.0.1:7001..7003), so one parallel worker runs
all of them, and the suite builds it once. They also hold :func:`fixed_ports_lock` while a
project is up: a lock of the whole host, so that two test processes (workers the grouping failed
to keep together, or two people's suites on one machine) never bring the fixed ports up at once.

Where no engine can run it (no Docker engine with its compose plugin, no Podman with
podman-compose), or no base image can be had, the tests skip and say why; a build that fails
otherwise fails them.

Must not import: a test module or a conftest.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster.engine import (
    COMPOSE_FILE,
    Engine,
    EngineUnavailable,
    choose_engine,
    project_containers,
    project_leftovers,
    run_command,
)
from cluster.image import BaseImageUnavailable, ImageBuild, build_image, try_lock
from rcq.testing import wait_until
from rcq.tokens import new_token
from tests.helpers import COMPOSE_COMMAND_TIMEOUT_S, COMPOSE_PORTS_LOCK_TIMEOUT_S, CURL_TIMEOUT_S

HTTP_BASE_PORT = 7001  # node-i publishes its HTTP API on 127.0.0.1:7001+i (docker-compose.yml)
NODES = 3
PORTS_LOCK_NAME = "rcq-compose-ports.lock"  # in the system's temporary directory: one for the host
LOCK_POLL_S = 1.0  # between two tries for the ports' lock

_engine: list[Engine | str] = []
_images: dict[str, ImageBuild] = {}


def engine_or_skip() -> Engine:
    """The engine ``auto`` picks (cluster.engine), asked once per process; skips saying why there is none."""
    if not _engine:
        try:
            _engine.append(choose_engine("auto"))
        except EngineUnavailable as exc:
            _engine.append(str(exc))
    found = _engine[0]
    if isinstance(found, str):
        pytest.skip(f"{found} (./run tests installs podman, runc and podman-compose as root on Debian)")
    return found


def node_image(engine: Engine) -> ImageBuild:
    """``rcq:local`` built from this checkout, once per process (later calls reuse it)."""
    if engine.name not in _images:
        started = time.monotonic()
        try:
            _images[engine.name] = build_image(engine, say=lambda line: print(f"[image] {line}", flush=True))
        except BaseImageUnavailable as exc:
            pytest.skip(f"no base image for rcq:local here: {exc}")
        print(f"[image] built in {time.monotonic() - started:.0f} s", flush=True)
    return _images[engine.name]


@contextlib.contextmanager
def fixed_ports_lock(what: str) -> Iterator[None]:
    """The host's lock of the compose files' fixed ports, held while ``what`` runs (waited for, bounded)."""
    with open(Path(tempfile.gettempdir()) / PORTS_LOCK_NAME, "a") as handle:
        wait_until(lambda: try_lock(handle), COMPOSE_PORTS_LOCK_TIMEOUT_S, what=f"the compose ports' lock, for {what}",
                   interval_s=LOCK_POLL_S)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class ComposeProject:
    """docker-compose.yml as compose project ``project``, with a secret and an admin token of its own
    in the environment of every compose command (never on a command line)."""

    def __init__(self, engine: Engine, project: str) -> None:
        self.engine = engine
        self.project = project
        self.secret = secrets.token_urlsafe(32)
        self.token = new_token()

    @property
    def env(self) -> dict[str, str]:
        return {"RCQ_CLUSTER_SECRET": self.secret, "RCQ_ADMIN_TOKEN": self.token}

    def compose(self, *args: str, timeout_s: float = COMPOSE_COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        return self.engine.run_compose(["-f", str(COMPOSE_FILE), "-p", self.project, *args], timeout_s, self.env)

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.engine.run(list(args), COMPOSE_COMMAND_TIMEOUT_S, check=check)

    def container(self, i: int) -> str:
        (found,) = project_containers(self.engine, self.project, f"node-{i}")
        return found

    def leftovers(self) -> dict[str, list[str]]:
        return project_leftovers(self.engine, self.project)

    def url(self, i: int) -> str:
        return f"http://127.0.0.1:{HTTP_BASE_PORT + i}"

    def healthy(self, i: int) -> bool:
        """Podman: ``podman healthcheck run`` (it runs checks on a schedule only through systemd) passes;
        Docker: the engine says the container is healthy."""
        if self.engine.name == "podman":
            return self.cli("healthcheck", "run", self.container(i), check=False).returncode == 0
        status = self.cli("inspect", "--format", "{{.State.Health.Status}}", self.container(i)).stdout.strip()
        return status == "healthy"


def curl_json(url: str, token: str | None = None, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    """(status, JSON body) of one plain ``curl`` request: POST with ``body``, else GET."""
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed")
    command = [curl, "--silent", "--show-error", "--max-time", str(CURL_TIMEOUT_S), "--noproxy", "*",
               "--write-out", "\n%{http_code}"]
    if token:
        command += ["--header", f"Authorization: Bearer {token}"]
    if body is not None:
        command += ["--header", "Content-Type: application/json", "--data", json.dumps(body)]
    done = run_command([*command, url], CURL_TIMEOUT_S + 5)
    text, _, status = done.stdout.rpartition("\n")
    return int(status), json.loads(text) if text.strip() else {}
