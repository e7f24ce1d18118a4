# Re-partition a prepared store into new clients (FeSEM §6.1: (a) IID, (b) Dir(0.5); `mcfl partition`).
# Only datasets whose `partition` block changes the store get this stage: `natural` clients with their
# own train/test split train on the prepared store directly (see `store()` in common.smk).
from mcfl.data.repartition import resolve as resolve_partition


def partition_of(dataset):
    return resolve_partition(config["datasets"][dataset].get("partition"))


def partition_args(dataset):
    return [a for k, v in partition_of(dataset).items() if v is not None
            for a in (f"--{k.replace('_', '-')}", str(v))]


rule partition:
    input:
        lambda w: raw_store(w.dataset),
    output:
        directory(DATA + "/partitioned/{dataset}"),
    log:
        "logs/partition/{dataset}.log",
    params:
        partition=lambda w: canonical_json(partition_of(w.dataset)),
        store_format=STORE_FORMAT,      # a store of an older format is made again
        args=lambda w: partition_args(w.dataset),
    shell:
        "mcfl partition {input:q} --out {output:q} {params.args:q} > {log:q} 2>&1"
