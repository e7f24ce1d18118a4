# Prepare every configured dataset into the on-disk store (DVC versions DATA/).


def prepare_args(dataset):
    p = config["datasets"][dataset]["prepare"]
    args = [p["source"]]
    for key, value in p.items():
        if key == "source":
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, list):
            args += [f"{flag} {shlex.quote(str(v))}" for v in value]
        elif value is not None:
            args.append(f"{flag} {shlex.quote(str(value))}")
    return " ".join(args)


import shlex


rule prepare:
    input:
        raw_inputs,
    output:
        directory(DATA + "/{dataset}"),
    log:
        "logs/prepare/{dataset}.log",
    benchmark:
        RES + "/benchmarks/prepare/{dataset}.tsv"
    params:
        prepare=lambda w: canonical_json(config["datasets"][w.dataset]["prepare"]),
        args=lambda w: f"{prepare_args(w.dataset)} {raw_dir_arg(w.dataset)}",
    shell:
        "mcfl prepare {params.args} --out {output} > {log} 2>&1"


rule data_all:
    input:
        [store(d) for d in config["datasets"]],
