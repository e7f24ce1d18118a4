# One training job per (dataset, method, K, seed). Every knob of the run is in params.run, so a
# changed value reruns exactly the affected jobs and what depends on them.


rule train:
    input:
        unpack(P.train_inputs),
    output:
        metrics=P.run_file("metrics"),
        history=P.run_file("history"),
        assignments=P.run_file("assignments"),
        predictions=P.run_file("predictions"),
        state=P.run_file("state"),
    log:
        P.logs("train/{dataset}/{run}/seed{seed}.log"),
    benchmark:
        P.res("benchmarks/train/{dataset}/{run}/seed{seed}.tsv")
    threads: 1
    resources:
        gpu=GPU,
    params:
        run=P.run_json,
        centres=P.centres_flag,
        checkpoint=P.checkpoint,
        tracking=P.tracking_flag(),
        device=config["device"],
        k=P.k_flag,
    shell:
        "mcfl train --run {params.run:q} --store {input.store:q} {params.centres:q} {params.k:q} "
        '--out "$(dirname {output.metrics:q})" --checkpoint {params.checkpoint:q} {params.tracking:q} '
        "--device {params.device:q} --threads {threads:q} > {log:q} 2>&1"
