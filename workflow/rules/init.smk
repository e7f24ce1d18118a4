# Cluster-centre initialisation (FeSEM §6.1): every client's first local model, then k-means with
# 20 restarts; one file per distinct centre spec and seed (mcfl.plan.train.TrainPlan.init_file), shared by the
# runs that would compute the same centres.


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
    shell:
        "mcfl init-centres --run {params.run:q} --store {input.store:q} --out {output:q} {params.k:q} "
        "--device {params.device:q} --threads {threads:q} > {log:q} 2>&1"
