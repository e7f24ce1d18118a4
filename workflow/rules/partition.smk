# Re-partition a prepared store into new clients (FeSEM §6.1: (a) IID, (b) Dir(0.5); `mcfl partition`).
# Only datasets whose `partition` block changes the store get this stage: `natural` clients with their
# own train/test split train on the prepared store directly (see mcfl.plan.Plan.store).


rule partition:
    input:
        P.prepare.raw_store_of,
    output:
        directory(P.data("partitioned/{dataset}")),
    log:
        "logs/partition/{dataset}.log",
    # before every other job: short, and everything waits for them (mcfl.plan.train)
    priority: P.training.data_priority
    params:
        partition=P.prepare.partition_json,
        store_format=STORE_FORMAT,  # a store of an older format is made again
        args=P.prepare.partition_args,
    shell:
        "mcfl partition {input:q} --out {output:q} {params.args:q} > {log:q} 2>&1"
