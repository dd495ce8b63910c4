"""cluster.engine and cluster.image without an engine: which engine ``auto`` picks (against fake
``docker``, ``podman`` and ``podman-compose`` executables), the containers.conf written for Podman,
the Debian mirror read from apt's sources, and the wheels' digest (the cache key of their layer).
tests/integration/test_compose.py builds and runs the image for real."""

from __future__ import annotations

import resource
import sys
import textwrap
from pathlib import Path

import pytest

from cluster import engine as engine_module
from cluster.engine import EngineUnavailable, choose_engine, container_ulimits, containers_conf_text
from cluster.image import apt_mirror, wheels_digest

FAKE = textwrap.dedent("""\
    import os, sys
    name, argv = os.path.basename(sys.argv[0]), sys.argv[1:]
    line = " ".join([name, *argv])
    if any(broken and line.startswith(broken) for broken in os.environ.get("FAKE_BROKEN", "").split(",")):
        sys.stderr.write(name + ": Cannot connect to the daemon\\n")
        sys.exit(1)
    print({"docker": "28.0.0-fake", "podman": "4.3.1-fake"}.get(name, "podman-compose version 1.6.0-fake"))
    """)


@pytest.fixture
def fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("docker", "podman", "podman-compose", "runc"):
        (bin_dir / name).write_text(f"#!{sys.executable}\n" + FAKE)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("FAKE_BROKEN", raising=False)
    return tmp_path


def test_auto_takes_docker_when_its_engine_and_compose_plugin_answer(fakes: Path) -> None:
    chosen = choose_engine("auto", fakes / "state")
    assert (chosen.name, chosen.compose, dict(chosen.env)) == ("docker", ("docker", "compose"), {})


@pytest.mark.parametrize("broken", ["docker version", "docker compose"])
def test_auto_takes_podman_when_docker_has_no_engine_or_no_compose(fakes: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    broken: str) -> None:
    monkeypatch.setenv("FAKE_BROKEN", broken)
    chosen = choose_engine("auto", fakes / "state")
    assert chosen.name == "podman" and chosen.compose == (str(fakes / "bin" / "podman-compose"),)
    assert chosen.env == {"CONTAINERS_CONF": str(fakes / "state" / "containers.conf"), "BUILDAH_FORMAT": "docker"}
    assert 'runtime = "runc"' in (fakes / "state" / "containers.conf").read_text()


def test_an_engine_asked_for_by_name_is_that_one_or_says_why_not(fakes: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert choose_engine("podman", fakes / "state").name == "podman"
    monkeypatch.setenv("FAKE_BROKEN", "docker version")
    with pytest.raises(EngineUnavailable, match=r"Docker: `docker version` reaches no engine: .*Cannot connect") as raised:
        choose_engine("docker", fakes / "state")
    assert "Podman" not in str(raised.value)


def test_with_neither_engine_every_reason_is_given(fakes: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_BROKEN", "docker compose,podman")
    monkeypatch.setattr(engine_module, "podman_compose_command", lambda: None)  # nor beside this Python
    with pytest.raises(EngineUnavailable) as raised:
        choose_engine("auto", fakes / "state")
    message = str(raised.value)
    assert "Docker: no docker compose plugin" in message and "Podman: podman-compose is not installed" in message


def test_containers_get_the_hard_limits_and_no_more_processes_than_pid_max(tmp_path: Path) -> None:
    (tmp_path / "pid_max").write_text("1000\n")
    limits = container_ulimits(pid_max_file=tmp_path / "pid_max", nr_open_file=tmp_path / "none")
    nofile_hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert limits["nproc"] <= 1000 and limits["nofile"] == (nofile_hard if nofile_hard != resource.RLIM_INFINITY
                                                            else engine_module.NOFILE_FALLBACK)
    text = containers_conf_text({"nofile": 20000, "nproc": 1000})
    assert 'default_ulimits = ["nofile=20000:20000", "nproc=1000:1000"]' in text and 'runtime = "runc"' in text


def test_the_debian_mirror_is_the_one_apt_uses_not_its_security_suite(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(textwrap.dedent("""\
        Types: deb
        URIs: http://security.mirror.example/debian-security
        Suites: bookworm-security
        Components: main

        Types: deb
        # a comment
        URIs: http://mirror.example/debian/
        Suites: bookworm bookworm-updates
        Components: main
        """))
    assert apt_mirror(tmp_path) == "http://mirror.example/debian"
    one_line = tmp_path / "old"
    (one_line / "sources.list.d").mkdir(parents=True)
    (one_line / "sources.list").write_text("# deb http://ignored.example/debian bookworm main\n"
                                           "deb [signed-by=/k.gpg] http://other.example/debian bookworm main\n")
    assert apt_mirror(one_line) == "http://other.example/debian"
    assert apt_mirror(tmp_path / "nothing") is None


def test_the_wheels_digest_follows_their_names_and_bytes(tmp_path: Path) -> None:
    (tmp_path / "a-1-py3-none-any.whl").write_bytes(b"one")
    first = wheels_digest(tmp_path)
    assert wheels_digest(tmp_path) == first
    (tmp_path / "a-1-py3-none-any.whl").write_bytes(b"two")
    assert wheels_digest(tmp_path) != first
