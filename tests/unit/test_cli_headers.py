"""``rcq enqueue --header KEY=VALUE`` and the headers ``dequeue`` and ``peek`` print, against an
in-process node at feature level 2 (and one held at level 1, which refuses them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rcq.cli import main
from rcq.server.core.commands import SetLevel, encode
from rcq.testing import InMemoryReplicator
from tests.helpers.cli import rcq
from tests.helpers.nodes import running_node, url_of


async def test_headers_go_in_with_header_flags_and_are_printed_by_peek_and_dequeue(tmp_path: Path, capsys):
    replicator = InMemoryReplicator()
    replicator.apply_raw(encode(SetLevel(replicator.term, 1, 2, "0.2.0")))
    async with running_node(tmp_path, replicator) as node:
        url = url_of(node)
        code, _, err = await rcq(capsys, "enqueue", "--url", url, "jobs", "a", "--header", "tenant=acme",
                                 "--header", "note=x=y")
        assert code == 0, err
        assert (await rcq(capsys, "enqueue", "--url", url, "jobs", "plain"))[0] == 0
        assert await rcq(capsys, "peek", "--url", url, "jobs") == (0, "a\n  tenant: acme\n  note: x=y\n", "")
        code, out, _ = await rcq(capsys, "peek", "--json", "--url", url, "jobs")
        assert json.loads(out)["items"] == [{"value": "a", "encoding": "utf-8",
                                             "headers": {"tenant": "acme", "note": "x=y"}}]
        code, out, _ = await rcq(capsys, "dequeue", "--json", "--url", url, "jobs", "--max", "2")
        assert [item.get("headers") for item in json.loads(out)["items"]] == [{"tenant": "acme", "note": "x=y"}, None]


async def test_below_level_2_the_cli_says_why(tmp_path: Path, capsys):
    async with running_node(tmp_path, feature_level_auto=False) as node:
        code, out, err = await rcq(capsys, "enqueue", "--url", url_of(node), "jobs", "a", "--header", "k=v")
        assert code != 0 and out == "" and "feature_level_required" in err and "item headers" in err


@pytest.mark.parametrize("flag", ["novalue", "=v"])
def test_a_header_flag_that_is_not_key_equals_value_is_refused(flag, capsys):
    with pytest.raises(SystemExit) as raised:
        main(["enqueue", "--url", "http://127.0.0.1:1", "jobs", "a", "--header", flag])
    assert raised.value.code == 2 and "is not KEY=VALUE" in capsys.readouterr().err
