# `tracking: deferred`: training jobs skip MLflow; this job records every finished run (sweep runs
# too) from its files afterwards (mcfl.track.record_finished), nested under this invocation's sweep
# run. Runs already recorded (same metrics.json) are not recorded twice.

if config["tracking"] == "deferred":

    rule track:
        input:
            P.run_outputs("metrics.json", P.runs.values()),
        output:
            P.res("mlflow_runs.tsv"),
        log:
            P.logs("track.log"),
        params:
            experiment=config["experiment"],
            runs=P.input_dirs,
        shell:
            "mcfl track --experiment {params.experiment:q} --out {output:q} {params.runs:q} > {log:q} 2>&1"
