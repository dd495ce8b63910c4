"""``python -m bench.transport_floor``: the bare aiohttp exchange it measures really runs, over a
WebSocket and over HTTP, and the figures it prints are there (what they are is the bench's to say)."""

from __future__ import annotations

import re

import pytest

from bench.transport_floor import main

FIGURES = re.compile(r"(?P<transport>WebSocket|HTTP POST), 2 callers: (?P<rate>[\d,]+) exchanges/s; CPU per "
                     r"exchange: server (?P<server>\d+) µs, client (?P<client>\d+) µs")


@pytest.mark.parametrize("http", [False, True])
def test_it_exchanges_frames_with_a_child_server_and_prints_cpu_per_exchange(capsys, http):
    assert main(["--concurrency", "2", "--duration-s", "0.5", *(["--http"] if http else [])]) == 0
    found = FIGURES.search(capsys.readouterr().out)
    assert found, "no figures printed"
    assert found["transport"] == ("HTTP POST" if http else "WebSocket")
    assert int(found["rate"].replace(",", "")) > 0
