# K selection (FeSEM §5.2) for method entries with `K: auto`: one search per (dataset, run, seed) on
# a sample of clients; its chosen K feeds that run's centre initialisation and training
# (`--k-from`, see common.smk), and select_k.md/.csv report every candidate's scores.

AUTO = [k for k, r in RUNS.items() if r["select_k"]]


rule select_k:
    input:
        store=lambda w: store(w.dataset),
    output:
        SELECT_K,
    log:
        LOGS + "/select_k/{dataset}/{run}/seed{seed}.log",
    params:
        run=run_json,
        device=config["device"],
    threads: 1
    resources:
        gpu=GPU,
    shell:
        "mcfl select-k --run {params.run:q} --store {input.store:q} --out {output:q} "
        "--device {params.device:q} --threads {threads:q} > {log:q} 2>&1"


if AUTO:

    rule select_k_report:
        input:
            [SELECT_K.format(dataset=d, run=r, seed=s) for d, r, s in AUTO],
        output:
            csv=RES + "/select_k.csv",
            markdown=RES + "/select_k.md",
        log:
            LOGS + "/select_k_report.log",
        params:
            out=RES,
        shell:
            "mcfl report-select-k --out {params.out:q} {input:q} > {log:q} 2>&1"

    EXTRA_TARGETS += [RES + "/select_k.md"]
