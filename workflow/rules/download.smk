# LEAF sources (femnist, celeba): their raw files are downloaded (or copied from a local folder)
# once per source into DATA/raw/<source>/ and MD5-checked; `prepare` takes them as input through
# P.prepare.raw_inputs (nothing for the embedded sources) and reads them from there (--raw-dir). A source
# with an `inputs` hook (leaf_json) has those files as the prepare job's inputs instead.


rule download:
    output:
        P.data("raw/{source}/{file}"),
    log:
        "logs/download/{source}/{file}.log",
    wildcard_constraints:
        source=P.prepare.download_constraints()["source"],
        file=P.prepare.download_constraints()["file"],
    # before every other job: short, and everything waits for them (mcfl.plan.train)
    priority: P.training.data_priority
    params:
        args=P.prepare.download_args,
        raw=P.prepare.download_dir,
    shell:
        "mcfl download {wildcards.source:q} --file {wildcards.file:q} --out {params.raw:q} "
        "{params.args:q} > {log:q} 2>&1"
