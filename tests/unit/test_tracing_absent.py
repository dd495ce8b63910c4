"""Without the extra rcq[otel]: in a process where OpenTelemetry cannot be imported, the clients (async
and sync) work and import nothing of it, and rcq.client.tracing says which extra it needs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import INSTALLED_COMMAND_TIMEOUT_S

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r'''
import asyncio, sys, tempfile
from pathlib import Path


class NoOpenTelemetry:
    """A meta path finder that makes every opentelemetry module unimportable, as without the extra."""

    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError(f"No module named {name!r} (blocked by the test)")
        return None


sys.meta_path.insert(0, NoOpenTelemetry())

from rcq.client import RcqClient, SyncClient
from tests.helpers.nodes import running_node, url_of


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with running_node(Path(tmp)) as node, RcqClient(url_of(node)) as client:
            await client.enqueue("q", "a")
            async with client.transaction() as tx:
                await tx.enqueue("q", "b")
            received = await client.receive("q", 10)
            assert received is not None and [i.value for i in received.items] == [b"a", b"b"]
            await received.commit()
            url = url_of(node)

            def sync_use() -> list[bytes]:
                with SyncClient(url) as sync:
                    sync.enqueue("q", "c")
                    return sync.dequeue("q")

            assert await asyncio.to_thread(sync_use) == [b"c"]


asyncio.run(main())
try:
    import rcq.client.tracing
except ImportError as exc:
    print("tracing:", exc)
else:
    raise AssertionError("rcq.client.tracing imported without OpenTelemetry")
print("loaded:", sorted(name for name in sys.modules if name.startswith("opentelemetry")))
'''


def test_without_opentelemetry_the_clients_work_and_import_none_of_it():
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True,
                          timeout=INSTALLED_COMMAND_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr
    assert "tracing: rcq.client.tracing needs OpenTelemetry: pip install 'rcq[otel]'" in done.stdout
    assert "loaded: []" in done.stdout
