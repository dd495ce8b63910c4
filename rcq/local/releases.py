"""Another release of rcq, taken from this repository's own git history, made runnable beside this code.

:func:`materialise` writes a commit's tree (``git archive``) into ``<dir>/src`` and makes a scratch
venv ``<dir>/venv`` (no pip) whose only addition is a ``.pth`` file: the old source first, then the
site-packages directories of the interpreter running this code. So ``python -m rcq`` of that venv
runs the old release's code with the dependencies already installed here: no package index, no
network, a fraction of a second. The returned :class:`Release` is what a
:class:`~rcq.local.nodes.LocalNode` is given to run that release instead of the code under test.

Why the old source wins over this checkout: the checkout is installed *editable*, through an
``import`` line in a ``.pth`` file of this venv's site-packages that installs a meta-path finder
mapping ``rcq`` to this checkout. A ``.pth`` file is only executed in a directory ``site`` itself
processes; the scratch venv lists this venv's site-packages as a plain path, so that finder is never
installed there, and ``rcq`` is found on the path, where the old source comes first. Two more
things could put the new code first, and are kept out: the working directory (the release's
interpreter runs with ``-P``) and ``PYTHONPATH`` (:meth:`Release.environment` drops it).
:meth:`Release.rcq_file` asks the release's own interpreter, so a test can prove it.

The history must be there: a shallow clone or an exported tree has no previous release, and
:func:`materialise` then raises :class:`ReleaseUnavailable` (the upgrade tests fail on it; they
never skip).

Must not import: rcq.server (the release runs in its own interpreter), pysyncobj, lmdb, aiohttp.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import site
import subprocess
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)

# The previous release: rcq 0.2.0 (tag v0.2.0), the last commit before partitions. When a release
# is cut, this becomes that release's commit (docs/upgrades.md, "Testing against the previous release").
PREVIOUS_RELEASE = "e78735ce1469c774df8e76a867ef7e97b9924c57"
PREVIOUS_RELEASE_NAME = "0.2.0"

REPO_ROOT = Path(__file__).resolve().parents[2]  # rcq/local/releases.py -> the checkout
PTH_NAME = "rcq-release.pth"
GIT_TIMEOUT_S = 60.0
PYTHON_TIMEOUT_S = 60.0
PATH_VARIABLES = frozenset({"PYTHONPATH", "PYTHONHOME"})


class ReleaseUnavailable(RuntimeError):
    """The commit of a release is not in the repository this code lives in (or there is none)."""


@dataclasses.dataclass(frozen=True)
class Release:
    """A materialised release: its name, commit, the venv interpreter that runs it and its source."""

    name: str
    commit: str
    python: Path
    src: Path

    def rcq_argv(self) -> list[str]:
        """The argv prefix of ``python -m rcq`` of this release (``[*rcq_argv(), "serve", ...]``);
        run it with :meth:`environment`."""
        # -P: the working directory is not put first on the path (run from this checkout, it would
        # import the new code).
        return [str(self.python), "-P", "-m", "rcq"]

    @staticmethod
    def environment(env: Mapping[str, str]) -> dict[str, str]:
        """``env`` without what would put other code before the release's own: PYTHONPATH (the Spark
        tests' conftest sets it to this checkout for the whole run) and PYTHONHOME."""
        return {key: value for key, value in env.items() if key not in PATH_VARIABLES}

    def run_python(self, code: str) -> str:
        """Run ``code`` in this release's interpreter; its stdout (raises with stderr on failure)."""
        done = subprocess.run([str(self.python), "-P", "-c", code], capture_output=True, text=True,
                              timeout=PYTHON_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL,
                              env=self.environment(os.environ), cwd=self.src.parent)
        if done.returncode != 0:
            raise RuntimeError(f"release {self.name} ({self.commit[:12]}): {code!r} exited with "
                               f"{done.returncode}:\n{done.stderr}")
        return done.stdout

    def rcq_file(self) -> Path:
        """Where ``import rcq`` resolves in this release's interpreter (it must be under :attr:`src`)."""
        return Path(self.run_python("import rcq; print(rcq.__file__)").strip())

    # cached_property writes the instance's __dict__ directly, so it works on a frozen dataclass;
    # asked once per Release, as starting an interpreter that imports pydantic takes a moment.
    @functools.cached_property
    def node_config_fields(self) -> frozenset[str]:
        """The fields this release's ``NodeConfig`` accepts (it forbids any other)."""
        code = ("import json; from rcq.server.config import NodeConfig; "
                "print(json.dumps(sorted(NodeConfig.model_fields)))")
        return frozenset(json.loads(self.run_python(code)))

    def node_config(self, config: dict[str, object]) -> dict[str, object]:
        """``config`` (a node config the code under test writes) without the fields this release
        does not know: one it would refuse to start with, as its NodeConfig forbids extra fields."""
        known = self.node_config_fields
        dropped = sorted(set(config) - known)
        if dropped:
            log.debug("release %s does not know config fields %s; left out", self.name, dropped)
        return {key: value for key, value in config.items() if key in known}


def _git(root: Path, *args: str, stdout: int | None = subprocess.PIPE) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(root), *args], stdout=stdout, stderr=subprocess.PIPE,
                          stdin=subprocess.DEVNULL, timeout=GIT_TIMEOUT_S, check=False)


def require_commit(commit: str, root: Path = REPO_ROOT) -> str:
    """The full hash of ``commit`` in the repository at ``root``; ReleaseUnavailable if it is not there."""
    found = _git(root, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
    if found.returncode != 0:
        reason = _git(root, "rev-parse", "--git-dir").stderr.decode(errors="replace").strip()
        where = f"{root} is not a git repository ({reason})" if reason else f"it is not in the repository at {root}"
        raise ReleaseUnavailable(
            f"commit {commit} (a previous release of rcq) is needed to test upgrades, but {where}. "
            "These tests need a clone of rcq with its history: not a shallow clone (git fetch --unshallow) "
            "and not an exported tree.")
    return found.stdout.decode().strip()


def _site_packages() -> list[str]:
    """The current interpreter's site-packages directories, in its own order."""
    dirs = [*site.getsitepackages(), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    seen: list[str] = []
    for entry in dirs:
        if entry not in seen and Path(entry).is_dir():
            seen.append(entry)
    return seen


def materialise(commit: str, directory: Path, name: str | None = None, root: Path = REPO_ROOT) -> Release:
    """Commit ``commit`` of the repository at ``root`` as a runnable :class:`Release` in ``directory``
    (``src/``: its tree; ``venv/``: an interpreter that imports it first). ``directory`` must not
    hold a release yet; the caller removes it."""
    full = require_commit(commit, root)
    directory = Path(directory)
    src = directory / "src"
    src.mkdir(parents=True)
    # git archive | tar -x: the committed tree exactly, without a worktree to register or clean up.
    with subprocess.Popen(["git", "-C", str(root), "archive", "--format=tar", full], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, stdin=subprocess.DEVNULL) as archive:
        assert archive.stdout is not None
        untar = subprocess.run(["tar", "-x", "-C", str(src)], stdin=archive.stdout, capture_output=True,
                               timeout=GIT_TIMEOUT_S, check=False)
        archive.stdout.close()
        archive_err = archive.stderr.read() if archive.stderr is not None else b""
        archive.wait(GIT_TIMEOUT_S)
    if archive.returncode != 0 or untar.returncode != 0:
        raise RuntimeError(f"extracting commit {full}: git archive exited with {archive.returncode} "
                           f"({archive_err.decode(errors='replace').strip()}), tar with {untar.returncode} "
                           f"({untar.stderr.decode(errors='replace').strip()})")
    venv = directory / "venv"
    # The base interpreter, not this venv's: a venv of a venv would point its home at this venv.
    base_python = getattr(sys, "_base_executable", sys.executable)
    made = subprocess.run([base_python, "-m", "venv", "--without-pip", str(venv)], capture_output=True,
                          text=True, timeout=PYTHON_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL)
    if made.returncode != 0:
        raise RuntimeError(f"making the venv of commit {full} exited with {made.returncode}:\n{made.stderr}")
    python = venv / "bin" / "python"
    venv_site = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True,
        text=True, timeout=PYTHON_TIMEOUT_S, check=True, stdin=subprocess.DEVNULL).stdout.strip())
    # Plain path lines only: the old source first, then where this interpreter's dependencies are.
    # (This venv's own .pth files, among them the editable install's finder of the new code, are not
    # executed from a directory that is merely listed.)
    lines = [str(src), *_site_packages()]
    (venv_site / PTH_NAME).write_text("".join(f"{line}\n" for line in lines))
    return Release(name=name or full[:12], commit=full, python=python, src=src)
