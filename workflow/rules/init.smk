# Cluster-centre initialisation (FeSEM §6.1): every client's first local model, then k-means with
# 20 restarts; one file per distinct centre spec and seed (common.smk: INIT), shared by the runs
# that would compute the same centres.


rule init_centres:
    input:
        unpack(lambda w: {"store": store(w.dataset), **k_input(w, init_run(w))}),
    output:
        INIT,
    log:
        LOGS + "/init/{dataset}/{centres}/seed{seed}.log",
    benchmark:
        RES + "/benchmarks/init/{dataset}/{centres}/seed{seed}.tsv"
    params:
        run=init_json,
        device=config["device"],
        k=k_flag,
    threads: 1
    resources:
        gpu=GPU,
    shell:
        "mcfl init-centres --run {params.run:q} --store {input.store:q} --out {output:q} {params.k:q} "
        "--device {params.device:q} --threads {threads:q} > {log:q} 2>&1"
