"""Lab: the old stream reference (template as a raw-content dictionary) against the new one
(one stream, template first) and the store's all-packed net ratio, per trace."""
import json, subprocess, sys
from pathlib import Path
import zstandard
from controlplane.trace import read_trace
from controlplane.trace import replay as rp

for t in sys.argv[1:]:
    tp = Path(t)
    tr = read_trace(tp)
    tmpl, sb = rp._pages(tr)
    params = rp._zstd_params(len(tmpl) + len(sb))
    d = zstandard.ZstdCompressionDict(tmpl, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    old = len(zstandard.ZstdCompressor(dict_data=d, compression_params=params).compress(sb))
    out = tp.with_suffix(".replay.json")
    subprocess.run([sys.executable, "-m", "controlplane.trace.replay", str(tp), "--strategies",
                    "lz4,xdelta,all,all-packed", "--json", str(out)], check=True,
                   stdout=subprocess.DEVNULL)
    res = {r["strategy"]: r for r in json.loads(out.read_text())[0]["results"]}
    new = res["stream-ref"]["stored_bytes"]
    sbb = len(sb)
    row = {"trace": tp.stem, "sandbox_mib": sbb / 2**20, "old_ref_x": sbb / old, "new_ref_x": sbb / new,
           "old_over_new_bytes": old / new}
    for k in ("lz4", "xdelta", "all", "all-packed"):
        row[k + "_net"] = res[k]["net_ratio"]
        row[k + "_meta_pct"] = res[k]["meta_pct"]
    row["allpacked_of_new"] = res["all-packed"]["net_ratio"] / (sbb / new)
    row["allpacked_of_old"] = res["all-packed"]["net_ratio"] / (sbb / old)
    row["xdelta_vs_lz4"] = res["xdelta"]["net_ratio"] / res["lz4"]["net_ratio"]
    print(json.dumps(row), flush=True)
