# LEAF sources (femnist, celeba): their raw files are downloaded (or copied from a local folder)
# once per source into DATA/raw/<source>/ and MD5-checked; `prepare` takes them as input through
# raw_inputs() (nothing for the embedded sources) and reads them from there (--raw-dir). A source
# with an `inputs` hook (leaf_json) has those files as the prepare job's inputs instead.
import re

from mcfl.data import source_fn
from mcfl.data.leaf.cli import leaf_sources
from mcfl.data.leaf.fetch import is_url

RAW = DATA + "/raw"
LEAF_RAW = leaf_sources()      # source -> its function (with .raw_files)


def leaf_fetch_settings(source):
    """`origin` and `md5` of the datasets prepared from `source` (they share one download)."""
    blocks = [d["prepare"] for d in config["datasets"].values() if d["prepare"]["source"] == source]
    found = {canonical_json({k: b.get(k) for k in ("origin", "md5")}) for b in blocks}
    if len(found) > 1:
        raise WorkflowError(f"datasets prepared from {source} must agree on origin and md5: {sorted(found)}")
    return json.loads(found.pop()) if found else {}


def raw_inputs(w):
    """The files a dataset's store is made from: what its source's `inputs` hook names (leaf_json:
    the LEAF files, so editing one re-prepares the store), or a LEAF source's raw files (an
    extracted folder where one sits in place of its zip, in the raw directory or a local origin)."""
    prep = config["datasets"][w.dataset]["prepare"]
    fn = source_fn(prep["source"])
    if hasattr(fn, "inputs"):
        return fn.inputs(**{k: v for k, v in prep.items() if k != "source"})
    if prep["source"] not in LEAF_RAW:
        return []
    raw, origin = f"{RAW}/{prep['source']}", prep.get("origin") or ""
    local = origin if origin and not is_url(origin) else None
    out = []
    for f in fn.raw_files:
        alt = getattr(fn, "raw_alternatives", {}).get(f)
        if alt and os.path.isdir(f"{raw}/{alt}"):
            out.append(f"{raw}/{alt}")
        elif alt and local and not os.path.isfile(f"{local}/{f}") and os.path.isdir(f"{local}/{alt}"):
            out.append(f"{local}/{alt}")          # read in place by prepare (no copy, no checksum)
        else:
            out.append(f"{raw}/{f}")
    return out


def raw_dir_arg(dataset):
    src = config["datasets"][dataset]["prepare"]["source"]
    return ["--raw-dir", f"{RAW}/{src}"] if src in LEAF_RAW else []


def download_args(w):
    s = leaf_fetch_settings(w.source)
    args = ["--source", s["origin"]] if s.get("origin") else []
    return args + [a for m in s.get("md5") or [] for a in ("--md5", m)]


rule download:
    output:
        RAW + "/{source}/{file}",
    log:
        "logs/download/{source}/{file}.log",
    params:
        args=download_args,
        raw=lambda w: f"{RAW}/{w.source}",
    wildcard_constraints:
        source="|".join(LEAF_RAW) or "^$",
        file="|".join(re.escape(f) for fn in LEAF_RAW.values() for f in fn.raw_files) or "^$",
    shell:
        "mcfl download {wildcards.source:q} --file {wildcards.file:q} --out {params.raw:q} "
        "{params.args:q} > {log:q} 2>&1"
