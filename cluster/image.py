"""``python -m cluster image``: build the node image (``rcq:local``, cluster/Dockerfile) with no network inside.

Three steps, each said as it runs (and timed):

1. **The base image.** ``BASE`` (``--base``, ``$RCQ_BASE_IMAGE``, default ``python:3.11-slim``) if the
   engine has it or can pull it. Otherwise (no registry reachable; and without pulling again once it
   exists, unless a base is named) :data:`DEBIAN_BASE`, made here once from the Debian archive:
   ``debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm``
   (bookworm's Python is 3.11) from the mirror the host's apt uses (``$RCQ_DEBIAN_MIRROR`` to
   choose another), trimmed (no apt lists, docs, man pages, translations) and imported. Needs root
   and debootstrap; 30 s to 2 minutes (100 s on a busy 2-core machine).
2. **The wheels**, made on the host by this Python's pip with pip's own configuration (its index,
   proxy and CA bundle: nothing of them is written here) into ``build/image/wheels``: ``deps/``,
   the dependencies of ``rcq[server]`` (made again only when pyproject.toml changes), and ``rcq/``,
   this checkout's wheel (every build, reproducibly: an unchanged checkout makes the same wheel).
3. **The image**: ``ENGINE build --network none --build-arg BASE_IMAGE=... -t rcq:local`` from the
   repository root (``.dockerignore`` lets only the wheels in). The Dockerfile installs the wheels
   with ``pip --no-index`` into a venv, then removes pip: what is installed is ``rcq[server]`` and
   nothing else, as a non-root user, on Python 3.11 (checked).

The host's Python must be 3.11 (rcq's) on a glibc no newer than bookworm's, so that the wheels pip
picks here install in the image. Engines: :mod:`cluster.engine` (Docker or Podman).

Two builds of one checkout at once (two terminals, two test processes) take turns: each holds
``build/image/build.lock`` while it writes the wheels and builds.

Must not import: any rcq module but rcq.local.waits (it builds the package, it does not run it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from cluster.engine import ROOT, Engine, EngineCommandFailed, run_command
from rcq.local.waits import WaitTimeout, wait_until

IMAGE = "rcq:local"  # what docker-compose.yml's services run
BASE_DEFAULT = "python:3.11-slim"
BASE_ENV = "RCQ_BASE_IMAGE"
DEBIAN_BASE = "localhost/rcq-base:bookworm"
DEBIAN_SUITE = "bookworm"  # its python3 is 3.11, the minor rcq supports
DEBIAN_PACKAGES = ("python3", "python3-venv", "ca-certificates")
MIRROR_ENV = "RCQ_DEBIAN_MIRROR"
APT_SOURCES = Path("/etc/apt")
WORK_DIR = ROOT / "build" / "image"  # the wheels (the only part of the build context the image sees)
DOCKERFILE = ROOT / "cluster" / "Dockerfile"

PULL_TIMEOUT_S = 300.0  # a base image of ~50 MB; a registry that is not there fails within a second
DEBOOTSTRAP_TIMEOUT_S = 900.0  # ~120 packages from the archive
IMPORT_TIMEOUT_S = 300.0
WHEELS_TIMEOUT_S = 900.0  # the dependencies' wheels, downloaded (or from pip's cache)
BUILD_TIMEOUT_S = 900.0
INSPECT_TIMEOUT_S = 60.0
BUILD_LOCK_TIMEOUT_S = 1800.0  # another build of this checkout finishes (a first one, debootstrap included)
BUILD_LOCK_POLL_S = 1.0
REPRODUCIBLE_EPOCH = "315532800"  # 1980-01-01, the earliest time a zip entry can have

Say = Callable[[str], None]


class BaseImageUnavailable(EngineCommandFailed):
    """No base image here, none can be pulled, and none can be made on this host (no debootstrap, no
    root, no Debian mirror known): the message says which, and what to do."""


def say_on_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclasses.dataclass
class ImageBuild:
    """What :func:`build_image` did, for the caller to report."""

    engine: str
    image: str
    base: str
    base_built: bool  # the Debian base was made by debootstrap in this build
    size_bytes: int
    seconds: dict[str, float]  # step -> wall time


# ------------------------------------------------------------------ 1. the base
def image_exists(engine: Engine, name: str) -> bool:
    return engine.run(["image", "inspect", "--format", "{{.Id}}", name], INSPECT_TIMEOUT_S, check=False).returncode == 0


def apt_mirror(apt_dir: Path = APT_SOURCES) -> str | None:
    """The Debian archive the host's apt uses (not a security or updates suite), or None."""
    found: list[tuple[str, list[str]]] = []  # (URI, suites)
    for path in sorted(apt_dir.glob("sources.list.d/*.sources")):
        for stanza in path.read_text(errors="replace").split("\n\n"):
            fields = {}
            for line in stanza.splitlines():
                if line.strip() and not line.startswith(("#", " ")) and ":" in line:
                    key, _, value = line.partition(":")
                    fields[key.strip().lower()] = value.split()
            if "deb" in fields.get("types", []) and fields.get("enabled", ["yes"]) != ["no"]:
                found += [(uri, fields.get("suites", [])) for uri in fields.get("uris", [])]
    for path in [apt_dir / "sources.list", *sorted(apt_dir.glob("sources.list.d/*.list"))]:
        if not path.is_file():
            continue
        for raw in path.read_text(errors="replace").splitlines():
            line = raw.split("#", 1)[0].strip()  # "deb [options] URI suite components"
            if not line.startswith("deb "):
                continue
            rest = line[4:].strip()
            words = (rest.split("]", 1)[1] if rest.startswith("[") else rest).split()
            if len(words) >= 2:
                found.append((words[0], [words[1]]))
    plain = [uri for uri, suites in found if uri.startswith(("http://", "https://"))
             and any(not s.endswith(("-security", "-updates", "-backports")) for s in suites)
             and "debian" in uri and "security" not in uri]
    return plain[0].rstrip("/") if plain else None


def build_debian_base(engine: Engine, say: Say, name: str = DEBIAN_BASE) -> None:
    """``name`` from the Debian archive (see the module docstring)."""
    if shutil.which("debootstrap") is None:
        raise BaseImageUnavailable("no base image and no debootstrap to make one (Debian: apt-get install debootstrap; "
                                  "or pass --base IMAGE, an image with Python 3.11 the engine has)")
    if os.geteuid() != 0:
        raise BaseImageUnavailable("no base image, and debootstrap needs root: run `python -m cluster image` as root "
                                  "once, or pass --base IMAGE (docs/deploy.md)")
    mirror = os.environ.get(MIRROR_ENV) or apt_mirror()
    if not mirror:
        raise BaseImageUnavailable(f"no Debian mirror in the host's apt sources: set {MIRROR_ENV}")
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    rootfs = Path(tempfile.mkdtemp(prefix="rootfs-", dir=WORK_DIR))
    try:
        say(f"base: debootstrap {DEBIAN_SUITE} ({', '.join(DEBIAN_PACKAGES)}) from {mirror}")
        run_command(["debootstrap", "--variant=minbase", f"--include={','.join(DEBIAN_PACKAGES)}", DEBIAN_SUITE,
                     str(rootfs), mirror], DEBOOTSTRAP_TIMEOUT_S)
        for trimmed in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/locale",
                        "usr/share/info", "var/log"):
            for entry in (rootfs / trimmed).glob("*"):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        say(f"base: importing it as {name}")
        with subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE) as tar:
            engine.run(["import", "-", name], IMPORT_TIMEOUT_S, stdin=tar.stdout.fileno() if tar.stdout else None)
        if tar.returncode != 0:
            raise EngineCommandFailed(f"tar of the Debian root file system exited {tar.returncode}")
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)


def ensure_base(engine: Engine, wanted: str | None, say: Say) -> tuple[str, bool]:
    """(the base image to build on, whether it was made now by debootstrap). One named (``wanted``,
    ``$RCQ_BASE_IMAGE``) is used or pulled, never replaced; the default is used when here, else the
    Debian base made earlier, else pulled, else the Debian base is made."""
    named = wanted or os.environ.get(BASE_ENV)
    base = named or BASE_DEFAULT
    if image_exists(engine, base):
        return base, False
    if not named and image_exists(engine, DEBIAN_BASE):
        say(f"base: {DEBIAN_BASE}, made earlier from the Debian archive ({base} is not here)")
        return DEBIAN_BASE, False
    say(f"base: pulling {base}")
    pulled = engine.run(["pull", base], PULL_TIMEOUT_S, check=False)
    if pulled.returncode == 0:
        return base, False
    if named:  # asked for by name: no substitute
        raise BaseImageUnavailable(f"base image {base} is not here and cannot be pulled: {pulled.stderr.strip()[-500:]}")
    say(f"base: {base} cannot be pulled ({(pulled.stderr.strip().splitlines() or ['?'])[-1][:200]})")
    build_debian_base(engine, say)
    return DEBIAN_BASE, True


# ------------------------------------------------------------------ 2. the wheels
def dependencies_stamp() -> str:
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()


def build_wheels(say: Say, work_dir: Path = WORK_DIR) -> None:
    """``work_dir/wheels/deps`` (rcq[server]'s dependencies) and ``work_dir/wheels/rcq`` (this checkout)."""
    deps, own = work_dir / "wheels" / "deps", work_dir / "wheels" / "rcq"
    stamp = work_dir / "wheels" / "deps.stamp"
    pip = [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check"]
    if not stamp.is_file() or stamp.read_text() != dependencies_stamp() or not any(deps.glob("*.whl")):
        say("wheels: rcq[server]'s dependencies, with the host's pip")
        shutil.rmtree(deps, ignore_errors=True)
        run_command([*pip, "--wheel-dir", str(deps), f"{ROOT}[server]"], WHEELS_TIMEOUT_S)
        for wheel in deps.glob("rcq-*.whl"):
            wheel.unlink()  # this checkout's own wheel goes to rcq/, made every build
        stamp.write_text(dependencies_stamp())
    say("wheels: rcq, from this checkout")
    shutil.rmtree(own, ignore_errors=True)
    shutil.rmtree(ROOT / "build" / "lib", ignore_errors=True)  # setuptools packs what it finds there: no stale module
    # The same source makes the same bytes (zip times from SOURCE_DATE_EPOCH): its layer's cache then
    # holds, and a second build of an unchanged checkout (another test module, a chaos run) reuses the image.
    run_command([*pip, "--no-deps", "--wheel-dir", str(own), str(ROOT)], WHEELS_TIMEOUT_S,
                {**os.environ, "SOURCE_DATE_EPOCH": REPRODUCIBLE_EPOCH})
    shutil.rmtree(ROOT / "build" / "lib", ignore_errors=True)


# ------------------------------------------------------------------ 3. the image
def try_lock(handle: IO[str]) -> bool:
    """Whether this process now holds the exclusive lock of the open file ``handle`` (never waits)."""
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def build_lock(say: Say) -> Iterator[None]:
    """This checkout's build lock (see the module docstring), waited for within BUILD_LOCK_TIMEOUT_S."""
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    path = WORK_DIR / "build.lock"
    with open(path, "a") as handle:
        if not try_lock(handle):
            say("waiting for another build of this checkout to finish")
            try:
                wait_until(lambda: try_lock(handle), BUILD_LOCK_TIMEOUT_S, what=f"the build lock {path.name}",
                           interval_s=BUILD_LOCK_POLL_S)
            except WaitTimeout as exc:
                raise EngineCommandFailed(str(exc)) from exc
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def wheels_digest(directory: Path) -> str:
    """One SHA-256 over the wheels of ``directory`` (names and bytes): the cache key of their layer."""
    digest = hashlib.sha256()
    for wheel in sorted(directory.glob("*.whl")):
        digest.update(wheel.name.encode() + b"\0" + hashlib.sha256(wheel.read_bytes()).digest())
    return digest.hexdigest()


def image_id(engine: Engine, image: str) -> str | None:
    done = engine.run(["image", "inspect", "--format", "{{.Id}}", image], INSPECT_TIMEOUT_S, check=False)
    return done.stdout.strip() or None if done.returncode == 0 else None


def image_size_bytes(engine: Engine, image: str = IMAGE) -> int:
    return int(engine.run(["image", "inspect", "--format", "{{.Size}}", image], INSPECT_TIMEOUT_S).stdout.strip())


def build_image(engine: Engine, base: str | None = None, image: str = IMAGE, say: Say = say_on_stderr) -> ImageBuild:
    """The three steps of the module docstring; raises :class:`~cluster.engine.EngineCommandFailed`."""
    with build_lock(say):
        return _build_image(engine, base, image, say)


def _build_image(engine: Engine, base: str | None, image: str, say: Say) -> ImageBuild:
    seconds: dict[str, float] = {}
    started = time.monotonic()
    base_image, base_built = ensure_base(engine, base, say)
    seconds["base_s"] = time.monotonic() - started
    mark = time.monotonic()
    build_wheels(say)
    seconds["wheels_s"] = time.monotonic() - mark
    mark = time.monotonic()
    say(f"image: {engine.name} build {image} on {base_image} (no network inside)")
    wheels = WORK_DIR / "wheels"
    previous = image_id(engine, image)
    engine.run(["build", "--network", "none", "--build-arg", f"BASE_IMAGE={base_image}",
                "--build-arg", f"DEPENDENCY_WHEELS_SHA256={wheels_digest(wheels / 'deps')}",
                "--build-arg", f"RCQ_WHEEL_SHA256={wheels_digest(wheels / 'rcq')}",
                "-f", str(DOCKERFILE), "-t", image, str(ROOT)], BUILD_TIMEOUT_S)
    if previous is not None and previous != image_id(engine, image):
        # the image it replaced, now untagged: removed unless a container still uses it
        engine.run(["rmi", previous], INSPECT_TIMEOUT_S, check=False)
    seconds["build_s"] = time.monotonic() - mark
    seconds["total_s"] = time.monotonic() - started
    return ImageBuild(engine.name, image, base_image, base_built, image_size_bytes(engine, image), seconds)
