"""``pip install rcq`` alone: what the wheel carries, and ``rcq token`` without the server extra.

The checkout's sources are copied to a temporary directory and installed with pip into a fresh
venv (no ``--system-site-packages``: a dependency missing from ``pyproject.toml`` fails here
instead of being found in this environment). pip builds the wheel and takes aiohttp and its
dependencies from the package index or its cache. The venv and the copy are removed afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rcq.tokens import parse_tokens_file, token_hash
from tests.helpers import INSTALL_TIMEOUT_S, INSTALLED_COMMAND_TIMEOUT_S

pytestmark = pytest.mark.install

ROOT = Path(__file__).resolve().parents[2]
# What pyproject.toml needs to build, and every top-level package, so that the test sees which
# of them the wheel leaves out.
SOURCES = ("pyproject.toml", "README.md", "rcq", "cluster", "chaos", "bench")


def _run(command: list[str | Path], cwd: Path, stdin: str | None = None,
         timeout_s: float = INSTALLED_COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """A command in ``cwd`` (never the checkout) with an environment that cannot reach this
    checkout's packages."""
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "RCQ_TOKEN")}
    return subprocess.run([str(c) for c in command], cwd=cwd, env=environment, input=stdin, capture_output=True,
                          text=True, timeout=timeout_s)


@pytest.fixture(scope="module")
def client_venv() -> Iterator[Path]:
    """A fresh venv holding ``pip install <this checkout>`` and nothing else (no extras)."""
    with tempfile.TemporaryDirectory(prefix="rcq-install-") as temp:
        work = Path(temp)
        source = work / "source"
        source.mkdir()
        for name in SOURCES:
            if (ROOT / name).is_dir():
                shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(ROOT / name, source / name)
        venv = work / "venv"
        created = _run([sys.executable, "-m", "venv", venv], cwd=work, timeout_s=INSTALL_TIMEOUT_S)
        assert created.returncode == 0, created.stderr
        installed = _run([venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                          "--no-input", source], cwd=work, timeout_s=INSTALL_TIMEOUT_S)
        assert installed.returncode == 0, f"pip install failed:\n{installed.stdout[-3000:]}\n{installed.stderr[-3000:]}"
        yield venv


def test_the_wheel_carries_rcq_and_the_launcher_and_no_server_extra(client_venv: Path, tmp_path: Path) -> None:
    python = client_venv / "bin" / "python"
    probe = ("import importlib.util as u, json; print(json.dumps({n: u.find_spec(n) is not None for n in "
             "['rcq', 'rcq.client', 'rcq.tokens', 'cluster', 'aiohttp', 'chaos', 'bench', 'tests', "
             "'pydantic', 'pysyncobj', 'lmdb', 'cryptography']}))")
    done = _run([python, "-c", probe], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "rcq": True, "rcq.client": True, "rcq.tokens": True, "cluster": True, "aiohttp": True,
        "chaos": False, "bench": False, "tests": False,  # harnesses run from a checkout
        "pydantic": False, "pysyncobj": False, "lmdb": False, "cryptography": False}  # the server extra


def test_rcq_token_works_with_the_client_install_alone(client_venv: Path, tmp_path: Path) -> None:
    rcq = client_venv / "bin" / "rcq"
    tokens_file = tmp_path / "tokens.json"
    created = _run([rcq, "token", "create", "--tokens-file", tokens_file, "--name", "orders-svc",
                    "--grant", "produce,consume:orders.*", "--expires-in-days", "30", "--json"], cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    token = json.loads(created.stdout)["token"]
    assert "store it now" in created.stderr and token not in created.stderr
    assert stat.S_IMODE(tokens_file.stat().st_mode) == 0o600
    [entry] = parse_tokens_file(tokens_file.read_text(), tokens_file)  # the format the server reads
    assert (entry.name, entry.sha256, entry.admin) == ("orders-svc", token_hash(token), False)
    assert [(g.queues, g.actions) for g in entry.grants] == [("orders.*", ("produce", "consume"))]
    assert entry.expires_at is not None

    assert _run([rcq, "token", "create", "--tokens-file", tokens_file, "--name", "ops", "--admin"],
                cwd=tmp_path).returncode == 0
    listed = _run([rcq, "token", "list", "--tokens-file", tokens_file, "--json"], cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert [t["name"] for t in json.loads(listed.stdout)["tokens"]] == ["orders-svc", "ops"]
    hashed = _run([rcq, "token", "hash"], cwd=tmp_path, stdin=token + "\n")
    assert (hashed.returncode, hashed.stdout) == (0, token_hash(token) + "\n"), hashed.stderr
    revoked = _run([rcq, "token", "revoke", "--tokens-file", tokens_file, "--name", "ops"], cwd=tmp_path)
    assert revoked.returncode == 0, revoked.stderr
    assert [e.name for e in parse_tokens_file(tokens_file.read_text(), tokens_file)] == ["orders-svc"]


def test_serve_without_the_server_extra_says_what_to_install(client_venv: Path, tmp_path: Path) -> None:
    done = _run([client_venv / "bin" / "rcq", "serve", "--node-id", "n1", "--http-port", "0",
                 "--raft-address", "127.0.0.1:1", "--data-dir", tmp_path / "data", "--insecure"], cwd=tmp_path)
    assert done.returncode != 0 and "rcq[server]" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
