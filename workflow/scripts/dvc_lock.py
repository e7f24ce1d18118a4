"""Record the code's and the config's hashes in dvc.lock without running anything (`make dvc-lock`).

`dvc commit --force`, except that an output that is not on disk (no `make reproduce` in this
checkout yet) keeps the hash dvc.lock already has instead of stopping the commit: the stages'
dependencies and parameters are hashed as they are now; outputs that exist are hashed and cached.
Run it from the repository's root after changing code or a config, before committing, so that
`dvc status dvc.yaml` after `make reproduce` on a fresh clone lists no changed dependency. Only the
default config's stages (``dvc.yaml``); the other configs' (``pipelines/dvc.yaml``) are recorded in
``pipelines/dvc.lock`` by their own ``dvc repro``.
"""

from __future__ import annotations

from itertools import groupby

from dvc.repo import Repo


def main() -> None:
    with Repo() as repo, repo.lock:
        # the default config's stages (./dvc.yaml); pipelines/dvc.yaml's entries lock when they run
        stages = [s for s in repo.index.stages if s.dvcfile.relpath == "dvc.yaml"]
        for stage in stages:
            stage.save(allow_missing=True, run_cache=False)
            stage.commit(allow_missing=True)
        for dvcfile, group in groupby(stages, key=lambda s: s.dvcfile):
            dvcfile.dump_stages(list(group), update_pipeline=False)
        print(f"dvc.lock: recorded {', '.join(s.addressing for s in stages)}")


if __name__ == "__main__":
    main()
