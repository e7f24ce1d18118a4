# FeSEM's clustering figures (§6.2) from a finished run's files: Fig. 4 (clients' local models in 2-D,
# coloured by cluster and by true cluster) and Fig. 5 (samples of a few clients of each cluster), for
# every dataset that has the run named in `figures` (its first seed). Fig. 3 is drawn by `report`.
import sys

FIG = config["figures"]


def figure_run(dataset, which):
    """(dataset, run_id, seed) of the run labelled figures.<which>.run on `dataset`, or None."""
    label, seed = FIG[which]["run"], str(config["seeds"][0])
    return next((k for k, r in RUNS.items() if k[0] == dataset and k[2] == seed
                 and r["label"] == label), None)


def figure_run_dir(w, which):
    d, run, seed = figure_run(w.dataset, which)
    return RUN_DIR.format(dataset=d, run=run, seed=seed)


def figure_datasets(which):
    found = [d for d in config["datasets"] if figure_run(d, which)]
    if FIG[which]["run"] and not found:
        print(f"figures.{which}.run: no dataset has a run labelled {FIG[which]['run']!r}; "
              f"figure skipped", file=sys.stderr)
    return found


rule figure_clusters:
    input:
        store=lambda w: store(w.dataset),
        state=lambda w: figure_run_dir(w, "clusters") + "/state.pt",
    output:
        png=report(RES + "/figures/clusters_{dataset}.png", caption="../report/clusters.rst",
                   category="Figures"),
        csv=RES + "/figures/clusters_{dataset}.csv",
    log:
        LOGS + "/figures/clusters_{dataset}.log",
    benchmark:
        RES + "/benchmarks/figures/clusters_{dataset}.tsv"
    params:
        run=lambda w: canonical_json(RUNS[figure_run(w.dataset, "clusters")]),
        clients=FIG["clusters"]["clients"],
        projection=FIG["clusters"]["projection"],
        seed=FIG["seed"],
        device=config["device"],
    threads: 1
    resources:
        gpu=GPU,
    shell:
        "mcfl figure clusters --run {params.run:q} --store {input.store:q} --state {input.state:q} "
        "--out {output.png:q} --clients {params.clients:q} --projection {params.projection:q} "
        "--seed {params.seed:q} --device {params.device:q} --threads {threads:q} > {log:q} 2>&1"


rule figure_cases:
    input:
        store=lambda w: store(w.dataset),
        assignments=lambda w: figure_run_dir(w, "cases") + "/assignments.csv",
    output:
        report(RES + "/figures/cases_{dataset}.png", caption="../report/cases.rst", category="Figures"),
    log:
        LOGS + "/figures/cases_{dataset}.log",
    benchmark:
        RES + "/benchmarks/figures/cases_{dataset}.tsv"
    params:
        title=lambda w: f"{w.dataset}: {FIG['cases']['run']} clusters, seed {config['seeds'][0]}",
        clients=FIG["cases"]["clients"],
        samples=FIG["cases"]["samples"],
        seed=FIG["seed"],
    shell:
        "mcfl figure cases --store {input.store:q} --assignments {input.assignments:q} --out {output:q} "
        "--title {params.title:q} --clients {params.clients:q} --samples {params.samples:q} "
        "--seed {params.seed:q} > {log:q} 2>&1"


EXTRA_TARGETS += [RES + f"/figures/clusters_{d}.png" for d in figure_datasets("clusters")]
EXTRA_TARGETS += [RES + f"/figures/cases_{d}.png" for d in figure_datasets("cases")]
