# FedGSP's tables and figures (paper 003 §4.2), made when the config has a `fedgsp` block:
#   cpd      Fig. 3a  CPD box plots of FedAvg / NaiveGSP / NaiveGSP+ICG groupings (data only)
#   table    Table 1 + Figs. 3b/3c (curves) + Fig. 6 (time and traffic to target), from the config's
#            runs on `fedgsp.dataset`
#   heatmap  Fig. 4   test loss over (alpha, beta) per growth function (sweep runs)
#   kappa    Fig. 5   accuracy and normalised time against kappa (sweep runs)
# Sweep runs are ordinary training jobs (rule `train`): they are added to RUNS here, reusing a
# configured run wherever a sweep point is identical to it.

if "fedgsp" in config:
    from mcfl.algorithms import fedgsp as _fedgsp_algo
    from mcfl.fedgsp.config import base_entry as _gsp_base
    from mcfl.fedgsp.config import sweep_runs as _gsp_sweeps
    from mcfl.report.fedgsp import train_settings as _gsp_train

    GSP = config["fedgsp"]
    GSP_DS = GSP["dataset"]
    GSP_OUT = RES + "/fedgsp/" + GSP_DS
    GSP_COST = canonical_json(GSP.get("cost", {}))
    GSP_MAIN = [r for r in RUNS.values() if r["dataset"] == GSP_DS]
    GSP_SWEEPS = _gsp_sweeps(config)
    for _kind in GSP_SWEEPS:
        for _r, _ in GSP_SWEEPS[_kind]:
            RUNS.setdefault((_r["dataset"], _r["run_id"], str(_r["seed"])), _r)

    def _gsp_dir(r):
        return RUN_DIR.format(dataset=r["dataset"], run=r["run_id"], seed=r["seed"])

    def _gsp_cpd_groups():
        if "cpd_groups" in GSP:
            return GSP["cpd_groups"]
        for e in config["methods"]:
            if e["method"] == "NaiveGSP+ICG" and GSP_DS in e.get("datasets", [GSP_DS]):
                return e.get("beta", _fedgsp_algo.NaiveICGParams.beta)
        return _fedgsp_algo.Params.beta

    _gsp_base_params = {**vars(_fedgsp_algo.Params()), **_gsp_base(config)}

    rule fedgsp_cpd:
        input:
            store=store(GSP_DS),
        output:
            csv=GSP_OUT + "/cpd.csv",
            summary=GSP_OUT + "/cpd_summary.csv",
            figure=report(GSP_OUT + "/cpd.png", caption="../report/fedgsp_cpd.rst", category="FedGSP"),
        log:
            LOGS + "/fedgsp/" + GSP_DS + "/cpd.log",
        params:
            groups=_gsp_cpd_groups(),
            seeds=[str(s) for s in config["seeds"]],
            rounding=_gsp_base_params["rounding"],
            iters=_gsp_base_params["icg_iters"],
            sigma=GSP.get("sigma", 1.0),
        shell:
            "mcfl fedgsp cpd --store {input.store:q} --groups {params.groups:q} --seeds {params.seeds:q} "
            "--rounding {params.rounding:q} --icg-iters {params.iters:q} --sigma {params.sigma:q} "
            "--out \"$(dirname {output.csv:q})\" > {log:q} 2>&1"

    rule fedgsp_table:
        input:
            store=store(GSP_DS),
            metrics=[_gsp_dir(r) + "/metrics.json" for r in GSP_MAIN],
        output:
            table=report(GSP_OUT + "/table.csv", caption="../report/fedgsp_table.rst", category="FedGSP"),
            markdown=GSP_OUT + "/table.md",
            runs=GSP_OUT + "/runs.csv",
            curves=report(GSP_OUT + "/curves.png", caption="../report/fedgsp_curves.rst", category="FedGSP"),
            cost=report(GSP_OUT + "/cost.png", caption="../report/fedgsp_cost.rst", category="FedGSP"),
        log:
            LOGS + "/fedgsp/" + GSP_DS + "/table.log",
        params:
            train=canonical_json(_gsp_train(GSP_MAIN)),
            dirs=[_gsp_dir(r) for r in GSP_MAIN],
            target=GSP["target"],
            cost=GSP_COST,
        shell:
            "mcfl fedgsp table --store {input.store:q} --target {params.target:q} --cost {params.cost:q} "
            "--train {params.train:q} --out \"$(dirname {output.table:q})\" {params.dirs:q} > {log:q} 2>&1"

    EXTRA_TARGETS += [rules.fedgsp_cpd.output.figure, rules.fedgsp_table.output.table]

    if GSP_SWEEPS["heatmap"]:

        rule fedgsp_heatmap:
            input:
                [_gsp_dir(r) + "/metrics.json" for r, _ in GSP_SWEEPS["heatmap"]],
            output:
                csv=GSP_OUT + "/heatmap.csv",
                figure=report(GSP_OUT + "/heatmap.png", caption="../report/fedgsp_heatmap.rst",
                              category="FedGSP"),
            log:
                LOGS + "/fedgsp/" + GSP_DS + "/heatmap.log",
            params:
                dirs=[_gsp_dir(r) for r, _ in GSP_SWEEPS["heatmap"]],
            shell:
                "mcfl fedgsp heatmap --out \"$(dirname {output.csv:q})\" {params.dirs:q} > {log:q} 2>&1"

        EXTRA_TARGETS.append(rules.fedgsp_heatmap.output.figure)

    if GSP_SWEEPS["kappa"]:

        rule fedgsp_kappa:
            input:
                store=store(GSP_DS),
                metrics=[_gsp_dir(r) + "/metrics.json" for r, _ in GSP_SWEEPS["kappa"]],
            output:
                csv=GSP_OUT + "/kappa.csv",
                figure=report(GSP_OUT + "/kappa.png", caption="../report/fedgsp_kappa.rst",
                              category="FedGSP"),
            log:
                LOGS + "/fedgsp/" + GSP_DS + "/kappa.log",
            params:
                train=canonical_json(_gsp_train([r for r, _ in GSP_SWEEPS["kappa"]])),
                dirs=[_gsp_dir(r) for r, _ in GSP_SWEEPS["kappa"]],
                cost=GSP_COST,
            shell:
                "mcfl fedgsp kappa --store {input.store:q} --cost {params.cost:q} --train {params.train:q} "
                "--out \"$(dirname {output.csv:q})\" {params.dirs:q} > {log:q} 2>&1"

        EXTRA_TARGETS.append(rules.fedgsp_kappa.output.figure)
