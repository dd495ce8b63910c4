"""Free loopback ports for local clusters (:func:`rcq.local.nodes.free_ports`): below the
ephemeral range, and in this process's slice of them when clusters start side by side (the
suite's parallel workers each take one, :data:`rcq.local.nodes.PORT_SLICE_ENV`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rcq.local import nodes
from rcq.local.nodes import LOW_PORTS_MIN, PORT_SLICE_ENV, free_port_range, free_ports, low_ports, port_slice


@pytest.fixture
def range_file(tmp_path: Path) -> Path:
    path = tmp_path / "ip_local_port_range"
    path.write_text("32768\t60999\n")
    return path


def test_slices_of_the_low_ports_are_disjoint_and_cover_them(range_file: Path) -> None:
    whole = low_ports(range_file, slice_text="")
    assert whole == range(LOW_PORTS_MIN, 32768)
    slices = [low_ports(range_file, slice_text=f"{k}/4") for k in range(4)]
    assert all(s is not None and len(s) == len(whole) // 4 for s in slices)
    seen: set[int] = set()
    for ports in slices:
        assert ports is not None and seen.isdisjoint(ports)
        seen.update(ports)
    assert len(whole) - len(seen) < 4


def test_free_ports_stay_in_the_slice_the_environment_names(range_file: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PORT_SLICE_ENV, "2/3")
    allowed = low_ports(range_file)
    assert allowed is not None and allowed.start > LOW_PORTS_MIN
    ports = free_ports(12, range_file)
    assert len(set(ports)) == 12 and all(port in allowed for port in ports), ports



def test_ports_picked_one_call_at_a_time_never_repeat_while_their_users_have_not_bound_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A config takes its ports one free_ports(1) at a time and binds none of them yet (a CI run
    once got two peers on one port): 240 picks among 2,000 ports would repeat one almost surely."""
    path = tmp_path / "ip_local_port_range"
    path.write_text(f"{LOW_PORTS_MIN + 2_000}\t60999\n")
    monkeypatch.delenv(PORT_SLICE_ENV, raising=False)
    picks = [free_ports(1, path)[0] for _ in range(nodes.PORT_SLICE_MIN // 2 - 10)]
    assert len(set(picks)) == len(picks)
    assert all(LOW_PORTS_MIN <= port < LOW_PORTS_MIN + 2_000 for port in picks)

@pytest.mark.parametrize("value, message", [
    ("3", "expected K/N"), ("a/4", "expected K/N"), ("1/2/3", "expected K/N"),
    ("4/4", "less than N"), ("-1/4", "at least 0"), ("0/0", "less than N"),
    ("0/100", "fewer than 500"),
])
def test_a_bad_slice_is_refused_with_what_is_wrong(value: str, message: str, range_file: Path) -> None:
    with pytest.raises(ValueError, match=message):
        low_ports(range_file, slice_text=value)


def test_no_room_below_the_range_leaves_the_choice_to_the_os(tmp_path: Path) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text(f"{LOW_PORTS_MIN + 100}\t60999\n")
    assert low_ports(path, slice_text="0/4") is None
    assert port_slice("1/4") == (1, 4) and nodes.PORT_SLICE_MIN <= (32768 - LOW_PORTS_MIN) // 4


def test_a_range_of_consecutive_ports_is_free_in_the_slice_and_not_handed_out_again(
        range_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PORT_SLICE_ENV, "1/4")
    allowed = low_ports(range_file)
    assert allowed is not None
    first, last = free_port_range(10, range_file)
    assert last - first == 9 and first in allowed and last in allowed
    assert not set(range(first, last + 1)) & set(free_ports(200, range_file))
