"""Planning of the data stage (``workflow/rules/data.smk``, ``partition.smk``, ``download.smk``):
each dataset's `mcfl prepare` and `mcfl partition` words, the files a store is made from, and the
LEAF downloads they share."""

from __future__ import annotations

import json
import os
import re
from typing import TYPE_CHECKING

from mcfl.config import ConfigError
from mcfl.data.repartition import resolve as resolve_partition
from mcfl.io import canonical_json

if TYPE_CHECKING:
    from mcfl.plan import Plan


def leaf_raw() -> dict:
    """LEAF source -> its function (with ``.raw_files``): the sources with files to download."""
    from mcfl.data.leaf.cli import leaf_sources     # (the LEAF readers: only where a rule asks)

    return leaf_sources()


class PreparePlan:
    """The data stage of a :class:`~mcfl.plan.Plan`."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.datasets = plan.datasets

    @property
    def raw_dir(self) -> str:
        return self.plan.data("raw")

    # -- prepare -----------------------------------------------------------------------------------
    def raw_store_of(self, w) -> str:
        return self.plan.raw_store(w.dataset)

    def prepare_json(self, w) -> str:
        return canonical_json(self.datasets[w.dataset]["prepare"])

    def prepare_args(self, w) -> list[str]:
        """`mcfl prepare`'s words for a dataset (a list: the shell command quotes each one)."""
        p = self.datasets[w.dataset]["prepare"]
        args = [p["source"]]
        for key, value in p.items():
            if key == "source":
                continue
            flag = "--" + key.replace("_", "-")
            if isinstance(value, bool):
                args.append(flag if value else "--no-" + key.replace("_", "-"))
            elif isinstance(value, list):
                args += [a for v in value for a in (flag, str(v))]
            elif value is not None:
                args += [flag, str(value)]
        src = p["source"]
        return args + (["--raw-dir", f"{self.raw_dir}/{src}"] if src in leaf_raw() else [])

    def raw_inputs(self, w) -> list[str]:
        """The files a dataset's store is made from: what its source's `inputs` hook names (leaf_json:
        the LEAF files, so editing one re-prepares the store), or a LEAF source's raw files (an
        extracted folder where one sits in place of its zip, in the raw directory or a local origin)."""
        from mcfl.data import source_fn                  # (the sources' readers: only where asked)
        from mcfl.data.leaf.fetch import is_url

        prep = self.datasets[w.dataset]["prepare"]
        fn = source_fn(prep["source"])
        if hasattr(fn, "inputs"):
            return fn.inputs(**{k: v for k, v in prep.items() if k != "source"})
        if prep["source"] not in leaf_raw():
            return []
        raw, origin = f"{self.raw_dir}/{prep['source']}", prep.get("origin") or ""
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

    # -- partition ---------------------------------------------------------------------------------
    def partition_of(self, dataset: str) -> dict:
        return resolve_partition(self.datasets[dataset].get("partition"))

    def partition_json(self, w) -> str:
        return canonical_json(self.partition_of(w.dataset))

    def partition_args(self, w) -> list[str]:
        return [a for k, v in self.partition_of(w.dataset).items() if v is not None
                for a in (f"--{k.replace('_', '-')}", str(v))]

    # -- LEAF downloads ------------------------------------------------------------------------------
    def leaf_fetch_settings(self, source: str) -> dict:
        """`origin` and `md5` of the datasets prepared from `source` (they share one download)."""
        blocks = [d["prepare"] for d in self.datasets.values() if d["prepare"]["source"] == source]
        found = {canonical_json({k: b.get(k) for k in ("origin", "md5")}) for b in blocks}
        if len(found) > 1:
            raise ConfigError(f"datasets prepared from {source} must agree on origin and md5: {sorted(found)}")
        return json.loads(found.pop()) if found else {}

    def download_args(self, w) -> list[str]:
        s = self.leaf_fetch_settings(w.source)
        args = ["--source", s["origin"]] if s.get("origin") else []
        return args + [a for m in s.get("md5") or [] for a in ("--md5", m)]

    def download_dir(self, w) -> str:
        return f"{self.raw_dir}/{w.source}"

    @staticmethod
    def download_constraints() -> dict[str, str]:
        raw = leaf_raw()
        return {"source": "|".join(raw) or "^$",
                "file": "|".join(re.escape(f) for fn in raw.values() for f in fn.raw_files) or "^$"}
