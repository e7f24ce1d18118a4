# FeSEM's clustering figures (§6.2) from a finished run's files: Fig. 4 (clients' local models in 2-D,
# coloured by cluster and by true cluster) and Fig. 5 (samples of a few clients of each cluster), for
# every dataset that has the run named in `figures` (its first seed: mcfl.plan.figures.FiguresPlan.figure_run).
# Fig. 3 is drawn by `report`.


rule figure_clusters:
    input:
        store=P.store_of,
        state=P.figures.figure_file("clusters", "state.pt"),
    output:
        png=report(
            P.res("figures/clusters_{dataset}.png"),
            caption="../report/clusters.rst",
            category="Figures",
        ),
        csv=P.res("figures/clusters_{dataset}.csv"),
    log:
        P.logs("figures/clusters_{dataset}.log"),
    benchmark:
        P.res("benchmarks/figures/clusters_{dataset}.tsv")
    threads: 1
    resources:
        gpu=GPU,
    params:
        run=P.figures.figure_run_json,
        clients=config["figures"]["clusters"]["clients"],
        projection=config["figures"]["clusters"]["projection"],
        seed=config["figures"]["seed"],
        device=config["device"],
    shell:
        "mcfl figure clusters --run {params.run:q} --store {input.store:q} --state {input.state:q} "
        "--out {output.png:q} --clients {params.clients:q} --projection {params.projection:q} "
        "--seed {params.seed:q} --device {params.device:q} --threads {threads:q} > {log:q} 2>&1"


rule figure_cases:
    input:
        store=P.store_of,
        assignments=P.figures.figure_file("cases", "assignments.csv"),
    output:
        report(
            P.res("figures/cases_{dataset}.png"),
            caption="../report/cases.rst",
            category="Figures",
        ),
    log:
        P.logs("figures/cases_{dataset}.log"),
    benchmark:
        P.res("benchmarks/figures/cases_{dataset}.tsv")
    params:
        title=P.figures.figure_cases_title,
        clients=config["figures"]["cases"]["clients"],
        samples=config["figures"]["cases"]["samples"],
        seed=config["figures"]["seed"],
    shell:
        "mcfl figure cases --store {input.store:q} --assignments {input.assignments:q} --out {output:q} "
        "--title {params.title:q} --clients {params.clients:q} --samples {params.samples:q} "
        "--seed {params.seed:q} > {log:q} 2>&1"
