"""Who pays for the store's metadata: the split of `meta_bytes` between a sandbox fleet and its
template, shared by the host replay and the guest benchmarks (docs/trace-format.md, "Replay
output"; docs/bench.md, "Net ratio").

The inputs are store stats by the names of struct az_stats (kmod/core/azcore.h), as the host
library returns them and as sysfs `meta_stat` names its columns (docs/sysfs-abi.md).
"""

from __future__ import annotations

from collections.abc import Mapping

# The per-page parts: charged to whoever stored the page.
PER_PAGE = ("slot_used_bytes", "obj_meta_bytes")
# The parts that exist for the sandboxes' sake (dedup, similarity and template indexes, the
# owner table, the decoded-base cache): charged to the sandboxes whole.
SHARED = ("index_table_bytes", "tnode_bytes", "owner_bytes", "base_cache_bytes")
NAMES = {
    "slot_used_bytes": "slots",
    "obj_meta_bytes": "object_headers",
    "index_table_bytes": "index_tables",
    "tnode_bytes": "template_index_nodes",
    "owner_bytes": "owner_table",
    "base_cache_bytes": "base_cache",
}


def meta_split(
    end: Mapping[str, int], tm: Mapping[str, int], start: Mapping[str, int] | None = None
) -> tuple[dict[str, int], dict[str, int]]:
    """Metadata of the sandboxes and of the template, by component.

    ``start`` is a snapshot before the template's pages were stored (None: an empty store),
    ``tm`` after them, ``end`` after the sandboxes'. The per-page parts are split at ``tm``;
    the shared parts go to the sandboxes whole. Unused slot entries are charged to neither
    (the store's ``slot_bytes - slot_used_bytes``: a device sized for more than it holds).
    """
    zero: Mapping[str, int] = start or dict.fromkeys(PER_PAGE, 0)
    sb = {NAMES[k]: end[k] - tm[k] for k in PER_PAGE}
    sb.update({NAMES[k]: end[k] for k in SHARED})
    tmpl = {NAMES[k]: tm[k] - zero[k] for k in PER_PAGE}
    return sb, tmpl
