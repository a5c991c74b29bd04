"""The trim step (controlplane.trim): free heap pages go back to the kernel, measured by the
process's own RssAnon; without malloc_trim nothing is trimmed and nothing fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from controlplane import trim as trim_mod

# A heap whose free memory sits below a live chunk: glibc's free() cannot give it back by
# shrinking the heap's top, only malloc_trim(0) can (MADV_DONTNEED on the free pages).
CHILD = """
import json, sys
from controlplane.trim import anon_bytes, trim
bufs = [bytes(1024) + bytes([i & 255]) for i in range(120_000)]   # ~120 MiB of malloc chunks
keep = bufs[-1]
del bufs
before_trim = anon_bytes()
t = trim()
json.dump({"before_trim": before_trim, "released": t.released_bytes,
           "malloc_trim": t.malloc_trim, "after": t.anon_after}, sys.stdout)
"""


def test_trim_returns_freed_heap_pages() -> None:
    import json

    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, check=True
    ).stdout
    r = json.loads(out)
    assert r["malloc_trim"], "glibc has malloc_trim"
    # most of the ~120 MiB freed by `del bufs` was still resident until trim()
    assert r["released"] >= 64 << 20, r


def test_anon_bytes_reads_rssanon(tmp_path: Path) -> None:
    st = tmp_path / "status"
    st.write_text("Name:\tpython\nRssAnon:\t   2048 kB\nRssFile:\t 10 kB\n")
    assert trim_mod.anon_bytes(st) == 2048 * 1024
    st.write_text("Name:\tpython\n")
    with pytest.raises(OSError, match="RssAnon"):
        trim_mod.anon_bytes(st)


def test_without_malloc_trim_nothing_breaks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trim_mod, "MALLOC_TRIM", None)
    t = trim_mod.trim()
    assert not t.malloc_trim
    assert t.released_bytes >= 0
