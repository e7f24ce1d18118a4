# Prepare every configured dataset into the on-disk store (DVC versions DATA/).


rule prepare:
    input:
        P.prepare.raw_inputs,
    output:
        directory(P.data("{dataset}")),
    log:
        "logs/prepare/{dataset}.log",
    benchmark:
        P.res("benchmarks/prepare/{dataset}.tsv")
    # before every other job: short, and everything waits for them (mcfl.plan.train)
    priority: P.training.data_priority
    params:
        prepare=P.prepare.prepare_json,
        store_format=STORE_FORMAT,
        args=P.prepare.prepare_args,
    shell:
        "mcfl prepare {params.args:q} --out {output:q} > {log:q} 2>&1"


rule data_all:
    input:
        P.stores(),
