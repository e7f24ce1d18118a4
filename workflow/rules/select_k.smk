# K selection (FeSEM §5.2) for method entries with `K: auto`: one search per (dataset, run, seed) on
# a sample of clients; its chosen K feeds that run's centre initialisation and training
# (`--k-from`, mcfl.plan.train.TrainPlan.k_input), and select_k.md/.csv report every candidate's scores.


rule select_k:
    input:
        store=P.store_of,
    output:
        P.training.select_k_file,
    log:
        P.logs("select_k/{dataset}/{run}/seed{seed}.log"),
    # before the centre file and the run waiting for its K (mcfl.plan.train)
    priority: P.training.select_k_priority
    threads: 1
    resources:
        gpu=GPU,
    params:
        run=P.training.run_json,
        device=config["device"],
    shell:
        "mcfl select-k --run {params.run:q} --store {input.store:q} --out {output:q} "
        "--device {params.device:q} --threads {threads:q} > {log:q} 2>&1"


if P.training.auto_k():

    rule select_k_report:
        input:
            P.training.select_k_files(),
        output:
            csv=P.res("select_k.csv"),
            markdown=P.res("select_k.md"),
        log:
            P.logs("select_k_report.log"),
        params:
            out=lambda w: RES,
        shell:
            "mcfl report-select-k --out {params.out:q} {input:q} > {log:q} 2>&1"
