"""A peer that comes back at a new address (a container restarted, recreated or reconnected) is
reached there (docs/raft-hazards.md, H21): its name is resolved again after ``raft_dns_cache_s``,
a dial to its old address that nobody answers is dropped after the connection timeout, and a
listener bound to 0.0.0.0 (``raft_bind_address``) hears peers whatever address the node has now.
tests/integration/test_compose.py restarts and reconnects real containers."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from pysyncobj import transport as transport_module
from pysyncobj.tcp_connection import CONNECTION_STATE

from rcq.server.raft import internals, transport_patches
from rcq.server.raft.settings import build_conf
from tests.helpers.nodes import make_config

PEER_CONNECTION_S = 3.5  # the fake transport's connectionTimeout (a setting, not a wait)


class Dial:
    def __init__(self, state: int) -> None:
        self.state = state
        self.disconnects = 0

    def disconnect(self) -> None:
        self.disconnects += 1
        self.state = CONNECTION_STATE.DISCONNECTED


def transport(dial: Dial, dialled_at: float) -> Any:
    return SimpleNamespace(_connections={"peer": dial}, _lastConnectAttempt={"peer": dialled_at},
                           _syncObj=SimpleNamespace(conf=SimpleNamespace(connectionTimeout=PEER_CONNECTION_S)))


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setattr(transport_module, "monotonicTime", lambda: 1_000.0)
    return 1_000.0


def test_a_dial_unanswered_past_the_connection_timeout_is_dropped(now: float) -> None:
    dial = Dial(CONNECTION_STATE.CONNECTING)
    assert internals.drop_unanswered_dial(transport(dial, now - PEER_CONNECTION_S - 0.1), "peer")
    assert (dial.disconnects, dial.state) == (1, CONNECTION_STATE.DISCONNECTED)


@pytest.mark.parametrize(("state", "age_s"), [
    (CONNECTION_STATE.CONNECTING, PEER_CONNECTION_S - 0.1),  # still within the timeout
    (CONNECTION_STATE.CONNECTED, 3600.0),  # answered: pysyncobj's own read timeout watches it
    (CONNECTION_STATE.DISCONNECTED, 3600.0),
])
def test_a_dial_answered_or_within_the_timeout_is_left_alone(now: float, state: int, age_s: float) -> None:
    dial = Dial(state)
    assert not internals.drop_unanswered_dial(transport(dial, now - age_s), "peer")
    assert dial.disconnects == 0


def test_the_transport_drops_an_unanswered_dial_before_it_dials_again(now: float) -> None:
    dial, seen = Dial(CONNECTION_STATE.CONNECTING), []
    dialling = transport_patches._dialling_configured_addresses(lambda self, node: seen.append(dial.state))
    dialling(transport(dial, now - 60.0), "peer")
    assert seen == [CONNECTION_STATE.DISCONNECTED]  # pysyncobj's own dial then connects anew


def test_the_raft_settings_resolve_names_again_and_bind_where_told() -> None:
    writer = SimpleNamespace(serialize=None, deserialize=None, check=None)
    conf = build_conf(make_config(raft_address="node-0:7100", raft_bind_address="0.0.0.0:7100", raft_dns_cache_s=2.0),
                      writer, auto_tick=False, on_state_changed=lambda old, new: None)
    assert (conf.bindAddress, conf.dnsCacheTime, conf.dnsFailCacheTime) == ("0.0.0.0:7100", 2.0, 2.0)
    default = build_conf(make_config(raft_address="node-0:7100"), writer, auto_tick=False,
                         on_state_changed=lambda old, new: None)
    assert (default.bindAddress, default.dnsCacheTime) == ("node-0:7100", 5.0)  # pysyncobj: 600 s
