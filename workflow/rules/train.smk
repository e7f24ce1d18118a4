# One training job per (dataset, method, K, seed). Every knob of the run is in params.run, so a
# changed value reruns exactly the affected jobs and what depends on them.


def train_inputs(w):
    inputs = {"store": store(w.dataset), **k_input(w)}
    if run_of(w)["needs_centres"]:
        inputs["centres"] = init_path(run_of(w))
    return inputs


rule train:
    input:
        unpack(train_inputs),
    output:
        metrics=RUN_DIR + "/metrics.json",
        history=RUN_DIR + "/history.csv",
        assignments=RUN_DIR + "/assignments.csv",
        predictions=RUN_DIR + "/predictions.csv",
        state=RUN_DIR + "/state.pt",
    log:
        LOGS + "/train/{dataset}/{run}/seed{seed}.log",
    benchmark:
        RES + "/benchmarks/train/{dataset}/{run}/seed{seed}.tsv"
    params:
        run=run_json,
        centres=lambda w, input: ["--centres", input.centres] if "centres" in input.keys() else [],
        checkpoint=lambda w: f"{RES}/checkpoints/{w.dataset}/{w.run}/seed{w.seed}.pt",
        tracking="--tracking" if config["tracking"] is True else "--no-tracking",
        device=config["device"],
        k=k_flag,
    threads: 1
    resources:
        gpu=GPU,
    shell:
        "mcfl train --run {params.run:q} --store {input.store:q} {params.centres:q} {params.k:q} "
        "--out \"$(dirname {output.metrics:q})\" --checkpoint {params.checkpoint:q} {params.tracking:q} "
        "--device {params.device:q} --threads {threads:q} > {log:q} 2>&1"
