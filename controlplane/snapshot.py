"""Load a memory snapshot file (a microVM's guest memory image) as template bases.

The file is streamed in batches of at most 15 pages (one TEMPLATE_LOAD each), so memory stays
bounded whatever its size.  All-zero pages are skipped: the module stores zero pages as same-filled
without a base, so a zero base would never be used.  The file must be a whole number of pages and
must not change while it is read (size and mtime are checked before, during and after).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from controlplane import errors
from controlplane.abi import MAX_LOAD_PAGES, PAGE_SIZE

ZERO_PAGE = bytes(PAGE_SIZE)


@dataclass
class LoadResult:
    pages_total: int
    pages_loaded: int
    pages_zero: int
    batches: int


def check_file(path: str) -> os.stat_result:
    try:
        st = os.stat(path)
    except OSError as e:
        raise errors.from_oserror(e, path) from None
    if st.st_size == 0 or st.st_size % PAGE_SIZE:
        raise errors.InvalidValue(
            f"{path}: size {st.st_size} is not a non-zero multiple of the page size ({PAGE_SIZE})"
        )
    return st


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_size, a.st_mtime_ns, a.st_ino) == (b.st_size, b.st_mtime_ns, b.st_ino)


def runs(buf: bytes, first_index: int) -> Iterator[tuple[int, bytes]]:
    """(index, pages) runs of non-zero pages in ``buf``."""
    start = None
    n = len(buf) // PAGE_SIZE
    for i in range(n + 1):
        zero = i == n or buf[i * PAGE_SIZE : (i + 1) * PAGE_SIZE] == ZERO_PAGE
        if not zero and start is None:
            start = i
        elif zero and start is not None:
            yield first_index + start, buf[start * PAGE_SIZE : i * PAGE_SIZE]
            start = None


def load(
    path: str,
    load_batch: Callable[[int, bytes], None],
    progress: Callable[[int], None] | None = None,
    batch_pages: int = MAX_LOAD_PAGES,
) -> LoadResult:
    """Stream ``path`` into ``load_batch(index, pages)``; ``progress(done)`` after each batch."""
    if not 1 <= batch_pages <= MAX_LOAD_PAGES:
        raise errors.InvalidValue(f"batch of {batch_pages} pages: must be 1..{MAX_LOAD_PAGES}")
    before = check_file(path)
    total = before.st_size // PAGE_SIZE
    loaded = zero = batches = 0
    index = 0
    with open(path, "rb") as f:
        while True:
            buf = f.read(batch_pages * PAGE_SIZE)
            if not buf:
                break
            if len(buf) % PAGE_SIZE:
                raise errors.InvalidValue(f"{path}: changed while loading (short read)")
            n = len(buf) // PAGE_SIZE
            for idx, pages in runs(buf, index):
                load_batch(idx, pages)
                batches += 1
                loaded += len(pages) // PAGE_SIZE
            zero = index + n - loaded
            index += n
            if not _same(before, os.fstat(f.fileno())):
                raise errors.InvalidValue(f"{path}: changed while loading")
            if progress is not None:
                progress(index)
    after = check_file(path)
    if not _same(before, after) or index != total:
        raise errors.InvalidValue(f"{path}: changed while loading")
    return LoadResult(total, loaded, zero, batches)
