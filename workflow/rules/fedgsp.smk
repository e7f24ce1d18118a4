# FedGSP's tables and figures (Zeng et al., DASFAA 2022, §4.2), made when the config has a `fedgsp` block:
#   cpd      Fig. 3a  CPD box plots of FedAvg / NaiveGSP / NaiveGSP+ICG groupings (data only)
#   table    Table 1 + Figs. 3b/3c (curves) + Fig. 6 (time and traffic to target), from the config's
#            runs on `fedgsp.dataset`
#   heatmap  Fig. 4   test loss over (alpha, beta) per growth function (sweep runs)
#   kappa    Fig. 5   accuracy and normalised time against kappa (sweep runs)
#   publish  Table 1 and the figures copied into the docs with their provenance (`fedgsp.publish`)
# Sweep runs are ordinary training jobs (rule `train`): mcfl.plan.Plan.runs has them, reusing a
# configured run wherever a sweep point is identical to it.

if P.fedgsp:

    rule fedgsp_cpd:
        input:
            store=P.store(P.fedgsp.dataset),
        output:
            csv=P.fedgsp.out("cpd.csv"),
            summary=P.fedgsp.out("cpd_summary.csv"),
            figure=report(P.fedgsp.out("cpd.png"), caption="../report/fedgsp_cpd.rst", category="FedGSP"),
        log:
            P.logs(f"fedgsp/{P.fedgsp.dataset}/cpd.log"),
        params:
            groups=P.fedgsp.cpd_groups(),
            seeds=[str(s) for s in config["seeds"]],
            rounding=P.fedgsp.base_params()["rounding"],
            iters=P.fedgsp.base_params()["icg_iters"],
            sigma=P.fedgsp.block.get("sigma", 1.0),
        shell:
            "mcfl fedgsp cpd --store {input.store:q} --groups {params.groups:q} --seeds {params.seeds:q} "
            "--rounding {params.rounding:q} --icg-iters {params.iters:q} --sigma {params.sigma:q} "
            '--out "$(dirname {output.csv:q})" > {log:q} 2>&1'

    rule fedgsp_table:
        input:
            store=P.store(P.fedgsp.dataset),
            metrics=P.run_outputs("metrics.json", P.fedgsp.main()),
        output:
            table=P.fedgsp.out("table.csv"),
            markdown=P.fedgsp.out("table.md"),
            # Snakemake's report shows HTML inline (a CSV only as a download)
            html=report(P.fedgsp.out("table.html"), caption="../report/fedgsp_table.rst", category="FedGSP"),
            runs=P.fedgsp.out("runs.csv"),
            curves=report(P.fedgsp.out("curves.png"), caption="../report/fedgsp_curves.rst", category="FedGSP"),
            cost=report(P.fedgsp.out("cost.png"), caption="../report/fedgsp_cost.rst", category="FedGSP"),
        log:
            P.logs(f"fedgsp/{P.fedgsp.dataset}/table.log"),
        params:
            train=P.fedgsp.train(P.fedgsp.main()),
            dirs=P.run_dirs(P.fedgsp.main()),
            target=P.fedgsp.block["target"],
            cost=P.fedgsp.cost(),
        shell:
            "mcfl fedgsp table --store {input.store:q} --target {params.target:q} --cost {params.cost:q} "
            '--train {params.train:q} --out "$(dirname {output.table:q})" {params.dirs:q} > {log:q} 2>&1'

    if P.fedgsp.block.get("publish"):

        rule fedgsp_publish:
            input:
                table=P.fedgsp.out("table.md"),
                figures=[P.fedgsp.out(f) for f in ("cpd.png", "curves.png", "cost.png")],
                runs=P.run_outputs("metrics.json", P.fedgsp.main()),
            output:
                P.fedgsp.block["publish"]["out"] + ".md",
            log:
                P.logs(f"fedgsp/{P.fedgsp.dataset}/publish.log"),
            params:
                results=lambda w: P.fedgsp.out(""),
                runs=P.run_dirs(P.fedgsp.main()),
                out=lambda w: P.fedgsp.block["publish"]["out"],
                title=P.fedgsp.block["publish"]["title"],
                config=(
                    os.path.relpath(workflow.overwrite_configfiles[0])
                    if workflow.overwrite_configfiles
                    else "config/config.yaml"
                ),
            shell:
                "mcfl publish --results {params.results:q} --figures . --out {params.out:q} "
                "--config {params.config:q} --title {params.title:q} {params.runs:q} > {log:q} 2>&1"

    if P.sweeps["heatmap"]:

        rule fedgsp_heatmap:
            input:
                P.run_outputs("metrics.json", P.fedgsp.sweep("heatmap")),
            output:
                csv=P.fedgsp.out("heatmap.csv"),
                figure=report(
                    P.fedgsp.out("heatmap.png"),
                    caption="../report/fedgsp_heatmap.rst",
                    category="FedGSP",
                ),
            log:
                P.logs(f"fedgsp/{P.fedgsp.dataset}/heatmap.log"),
            params:
                dirs=P.run_dirs(P.fedgsp.sweep("heatmap")),
            shell:
                'mcfl fedgsp heatmap --out "$(dirname {output.csv:q})" {params.dirs:q} > {log:q} 2>&1'

    if P.sweeps["kappa"]:

        rule fedgsp_kappa:
            input:
                store=P.store(P.fedgsp.dataset),
                metrics=P.run_outputs("metrics.json", P.fedgsp.sweep("kappa")),
            output:
                csv=P.fedgsp.out("kappa.csv"),
                figure=report(
                    P.fedgsp.out("kappa.png"),
                    caption="../report/fedgsp_kappa.rst",
                    category="FedGSP",
                ),
            log:
                P.logs(f"fedgsp/{P.fedgsp.dataset}/kappa.log"),
            params:
                train=P.fedgsp.train(P.fedgsp.sweep("kappa")),
                dirs=P.run_dirs(P.fedgsp.sweep("kappa")),
                cost=P.fedgsp.cost(),
            shell:
                "mcfl fedgsp kappa --store {input.store:q} --cost {params.cost:q} --train {params.train:q} "
                '--out "$(dirname {output.csv:q})" {params.dirs:q} > {log:q} 2>&1'
