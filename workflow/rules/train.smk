# One training job per (dataset, method, K, seed). Every knob of the run is in params.run, so a
# changed value reruns exactly the affected jobs and what depends on them. With `seeds_per_job: all`
# the runs that exist for every seed train in one job per (dataset, run) instead (rule train_seeds):
# the same run directories and outputs, one process start-up instead of one per seed.

# The progress bar goes to the job's log (tail -f it to watch); once the job has finished, its
# final accuracy line ("digits FedAvg seed 0: micro acc 0.7630, ...") is shown in Snakemake's output.


rule train:
    input:
        unpack(P.training.train_inputs),
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
    wildcard_constraints:
        run=P.training.run_constraint(grouped=False),
    # longest first (mcfl.plan.train: the run's work, from the config and the data's size)
    priority: P.training.train_priority
    threads: 1
    resources:
        gpu=GPU,
    params:
        run=P.training.run_json,
        centres=P.training.centres_flag,
        checkpoint=P.training.checkpoint,
        tracking=P.tracking_flag(),
        device=config["device"],
        k=P.training.k_flag,
    shell:
        "mcfl train --run {params.run:q} --store {input.store:q} {params.centres:q} {params.k:q} "
        '--out "$(dirname {output.metrics:q})" --checkpoint {params.checkpoint:q} {params.tracking:q} '
        "--device {params.device:q} --threads {threads:q} > {log:q} 2>&1 && "
        "sed -n 's/.*\\r//; /: micro acc /p' {log:q}"


if P.training.grouped:

    rule train_seeds:
        input:
            unpack(P.training.group_inputs),
        output:
            metrics=P.training.group_files("metrics"),
            history=P.training.group_files("history"),
            assignments=P.training.group_files("assignments"),
            predictions=P.training.group_files("predictions"),
            state=P.training.group_files("state"),
        log:
            P.logs("train/{dataset}/{run}/seeds.log"),
        benchmark:
            P.res("benchmarks/train/{dataset}/{run}/seeds.tsv")
        wildcard_constraints:
            run=P.training.run_constraint(grouped=True),
        priority: P.training.group_priority
        threads: 1
        resources:
            gpu=GPU,
        params:
            runs=P.training.group_args,  # --run, --out, --checkpoint [--centres] [--k-from], seed by seed
            tracking=P.tracking_flag(),
            device=config["device"],
        shell:
            "mcfl train {params.runs:q} --store {input.store:q} {params.tracking:q} "
            "--device {params.device:q} --threads {threads:q} > {log:q} 2>&1 && "
            "sed -n 's/.*\\r//; /: micro acc /p' {log:q}"
