# FedGSP's tables and figures (Zeng et al., DASFAA 2022, §4.2), made when the config has a `fedgsp` block:
#   cpd      Fig. 3a  CPD box plots of FedAvg / NaiveGSP / NaiveGSP+ICG groupings (data only)
#   table    Table 1 + Figs. 3b/3c (curves) + Fig. 6 (time and traffic to target), from the config's
#            runs on `fedgsp.dataset`
#   heatmap  Fig. 4   test loss over (alpha, beta) per growth function (sweep runs)
#   kappa    Fig. 5   accuracy and normalised time against kappa (sweep runs)
#   publish  Table 1 and the figures copied into the docs with their provenance (`fedgsp.publish`)
# Sweep runs are ordinary training jobs (rule `train`): mcfl.plan.Plan.runs has them, reusing a
# configured run wherever a sweep point is identical to it.

if P.gsp:

    rule fedgsp_cpd:
        input:
            store=P.store(P.gsp["dataset"]),
        output:
            csv=P.gsp_out("cpd.csv"),
            summary=P.gsp_out("cpd_summary.csv"),
            figure=report(P.gsp_out("cpd.png"), caption="../report/fedgsp_cpd.rst", category="FedGSP"),
        log:
            P.logs(f"fedgsp/{P.gsp['dataset']}/cpd.log"),
        params:
            groups=P.gsp_cpd_groups(),
            seeds=[str(s) for s in config["seeds"]],
            rounding=P.gsp_base_params()["rounding"],
            iters=P.gsp_base_params()["icg_iters"],
            sigma=P.gsp.get("sigma", 1.0),
        shell:
            "mcfl fedgsp cpd --store {input.store:q} --groups {params.groups:q} --seeds {params.seeds:q} "
            "--rounding {params.rounding:q} --icg-iters {params.iters:q} --sigma {params.sigma:q} "
            '--out "$(dirname {output.csv:q})" > {log:q} 2>&1'

    rule fedgsp_table:
        input:
            store=P.store(P.gsp["dataset"]),
            metrics=P.run_outputs("metrics.json", P.gsp_main()),
        output:
            table=report(P.gsp_out("table.csv"), caption="../report/fedgsp_table.rst", category="FedGSP"),
            markdown=P.gsp_out("table.md"),
            runs=P.gsp_out("runs.csv"),
            curves=report(P.gsp_out("curves.png"), caption="../report/fedgsp_curves.rst", category="FedGSP"),
            cost=report(P.gsp_out("cost.png"), caption="../report/fedgsp_cost.rst", category="FedGSP"),
        log:
            P.logs(f"fedgsp/{P.gsp['dataset']}/table.log"),
        params:
            train=P.gsp_train(P.gsp_main()),
            dirs=P.run_dirs(P.gsp_main()),
            target=P.gsp["target"],
            cost=P.gsp_cost(),
        shell:
            "mcfl fedgsp table --store {input.store:q} --target {params.target:q} --cost {params.cost:q} "
            '--train {params.train:q} --out "$(dirname {output.table:q})" {params.dirs:q} > {log:q} 2>&1'

    if P.gsp.get("publish"):

        rule fedgsp_publish:
            input:
                table=P.gsp_out("table.md"),
                figures=[P.gsp_out(f) for f in ("cpd.png", "curves.png", "cost.png")],
                runs=P.run_outputs("metrics.json", P.gsp_main()),
            output:
                P.gsp["publish"]["out"] + ".md",
            log:
                P.logs(f"fedgsp/{P.gsp['dataset']}/publish.log"),
            params:
                results=lambda w: P.gsp_out(""),
                runs=P.run_dirs(P.gsp_main()),
                out=lambda w: P.gsp["publish"]["out"],
                title=P.gsp["publish"]["title"],
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
                P.run_outputs("metrics.json", P.gsp_sweep("heatmap")),
            output:
                csv=P.gsp_out("heatmap.csv"),
                figure=report(
                    P.gsp_out("heatmap.png"),
                    caption="../report/fedgsp_heatmap.rst",
                    category="FedGSP",
                ),
            log:
                P.logs(f"fedgsp/{P.gsp['dataset']}/heatmap.log"),
            params:
                dirs=P.run_dirs(P.gsp_sweep("heatmap")),
            shell:
                'mcfl fedgsp heatmap --out "$(dirname {output.csv:q})" {params.dirs:q} > {log:q} 2>&1'

    if P.sweeps["kappa"]:

        rule fedgsp_kappa:
            input:
                store=P.store(P.gsp["dataset"]),
                metrics=P.run_outputs("metrics.json", P.gsp_sweep("kappa")),
            output:
                csv=P.gsp_out("kappa.csv"),
                figure=report(
                    P.gsp_out("kappa.png"),
                    caption="../report/fedgsp_kappa.rst",
                    category="FedGSP",
                ),
            log:
                P.logs(f"fedgsp/{P.gsp['dataset']}/kappa.log"),
            params:
                train=P.gsp_train(P.gsp_sweep("kappa")),
                dirs=P.run_dirs(P.gsp_sweep("kappa")),
                cost=P.gsp_cost(),
            shell:
                "mcfl fedgsp kappa --store {input.store:q} --cost {params.cost:q} --train {params.train:q} "
                '--out "$(dirname {output.csv:q})" {params.dirs:q} > {log:q} 2>&1'
