# Cluster-centre initialisation (FeSEM §6.1): every client's first local model, then k-means with
# 20 restarts; one file per distinct centre spec and seed (mcfl.plan.train.TrainPlan.init_file), shared by the
# runs that would compute the same centres. Centre files that cluster the same first local models
# (differing only in K or in how they cluster) take them from one first_models job where that pays
# (mcfl.plan.train.TrainPlan.shared_first); bit for bit what each would have trained itself.

if P.training.shared_first:

    rule first_models:
        input:
            store=P.training.first_store,
            gates=lambda w: list(P.gates_of(w.dataset).values()),
        output:
            P.training.first_models_file,
        log:
            P.logs("first_models/{dataset}/{first}/seed{seed}.log"),
        benchmark:
            P.res("benchmarks/first_models/{dataset}/{first}/seed{seed}.tsv")
        priority: P.training.first_priority
        threads: 1
        resources:
            gpu=GPU,
        params:
            run=P.training.first_json,
            device=config["device"],
        shell:
            "mcfl first-models --run {params.run:q} --store {input.store:q} --out {output:q} "
            "--device {params.device:q} --threads {threads:q} > {log:q} 2>&1"


rule init_centres:
    input:
        unpack(P.training.init_inputs),
    output:
        P.training.init_file,
    log:
        P.logs("init/{dataset}/{centres}/seed{seed}.log"),
    benchmark:
        P.res("benchmarks/init/{dataset}/{centres}/seed{seed}.tsv")
    # before the training jobs that wait for it (mcfl.plan.train: its work plus theirs)
    priority: P.training.init_priority
    threads: 1
    resources:
        gpu=GPU,
    params:
        run=P.training.init_json,
        device=config["device"],
        k=P.training.k_flag,
        first=P.training.first_flag,
    shell:
        "mcfl init-centres --run {params.run:q} --store {input.store:q} --out {output:q} {params.k:q} "
        "{params.first:q} --device {params.device:q} --threads {threads:q} > {log:q} 2>&1"
