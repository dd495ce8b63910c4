"""rcq.server.heap: with the heap's top kept, compressing a small Raft message stops faulting in
fresh pages on every call (what made it cost 57 µs instead of 10 on the development machine).

Counted in page faults (getrusage), not in time: each run is a fresh interpreter, so the other
test's allocator settings do not leak in.
"""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

CALLS = 2000
PROBE = f"""
import os, resource, sys, zlib
if sys.argv[1] == "kept":
    from rcq.server.heap import keep_heap_top
    assert keep_heap_top()
message = os.urandom(160) + b"a" * 160
for _ in range(50):
    zlib.compress(message, 1)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range({CALLS}):
    zlib.compress(message, 1)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the trim threshold is glibc's")


def faults(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=60, check=True)
    return int(done.stdout)


@glibc_only
def test_with_the_heap_top_kept_a_compression_faults_in_no_pages():
    assert faults("kept") < CALLS // 10


@glibc_only
def test_without_it_every_compression_faults_in_pages():
    # The control: what the node avoids (if a glibc changes this default, the tuning is moot).
    assert faults("default") > CALLS * 10


def test_elsewhere_keeping_the_heap_top_does_nothing(monkeypatch):
    from rcq.server import heap
    monkeypatch.setattr(heap.sys, "platform", "darwin")
    assert heap.keep_heap_top() is False
