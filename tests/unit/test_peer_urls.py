"""peer_urls: where a node reaches its peers' HTTP APIs when the URLs they advertise to clients
do not work between nodes (node-local configuration; tests/integration/test_forwarding_peer_urls.py
runs it in a real cluster)."""

from __future__ import annotations

import argparse

import pytest
from pydantic import ValidationError

from rcq.cli.serve import _peer, split_peers
from rcq.server.config import PeerConfig
from rcq.server.http.forwarding import Forwarder
from tests.helpers.nodes import make_config

PEERS = [{"node_id": "n2", "raft_address": "n2:7100", "http_url": "http://127.0.0.1:7002"},
         {"node_id": "n3", "raft_address": "n3:7100", "http_url": "http://127.0.0.1:7003"}]


def test_a_peer_url_is_the_entry_else_the_advertised_url_and_never_for_the_node_itself():
    config = make_config(node_id="n1", peers=PEERS,
                         peer_urls={"n1": "http://elsewhere:1", "n2": "http://n2:7000"})
    assert config.peer_url("n2", "http://127.0.0.1:7002") == "http://n2:7000"
    assert config.peer_url("n3", "http://127.0.0.1:7003") == "http://127.0.0.1:7003"
    assert config.peer_url("n1", "http://127.0.0.1:7001") == "http://127.0.0.1:7001"


@pytest.mark.parametrize("peer_urls", [{"n2": "n2:7000"}, {"bad id!": "http://n2:7000"}])
def test_a_peer_url_must_be_an_http_url_of_a_node_id(peer_urls):
    with pytest.raises(ValidationError, match="peer_urls"):
        make_config(peer_urls=peer_urls)


def test_the_forwarder_dials_the_leader_it_finds_by_its_advertised_url():
    config = make_config(node_id="n1", peers=PEERS, peer_urls={"n2": "http://n2:7000"})
    directory = {p["raft_address"]: PeerConfig(**p) for p in PEERS}
    forwarder = Forwarder(config, None, directory=lambda: directory)
    assert forwarder.dial_url("http://127.0.0.1:7002") == "http://n2:7000"
    assert forwarder.dial_url("http://127.0.0.1:7002/") == "http://n2:7000"
    assert forwarder.dial_url("http://127.0.0.1:7003") == "http://127.0.0.1:7003"  # no entry: as advertised
    assert forwarder.dial_url("http://unknown:1") == "http://unknown:1"


def test_a_peer_flag_may_name_the_peer_url_in_a_fourth_part():
    entries = [_peer("n2=n2:7100=http://127.0.0.1:7002=http://n2:7000"), _peer("n3=n3:7100=http://127.0.0.1:7003")]
    assert split_peers(entries) == {"peers": PEERS, "peer_urls": {"n2": "http://n2:7000"}}
    assert split_peers([entries[1]]) == {"peers": [PEERS[1]], "peer_urls": None}  # a config file's stands
    assert split_peers(None) == {"peers": None, "peer_urls": None}
    for bad in ("n2=n2:7100", "n2=n2:7100=http://a:1=", "=n2:7100=http://a:1"):
        with pytest.raises(argparse.ArgumentTypeError, match="peer_url"):
            _peer(bad)
