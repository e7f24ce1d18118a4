# Prepare every configured dataset into the on-disk store (DVC versions DATA/).


def prepare_args(dataset):
    """`mcfl prepare`'s words for a dataset (a list: the shell command quotes each one)."""
    p = config["datasets"][dataset]["prepare"]
    args = [p["source"]]
    for key, value in p.items():
        if key == "source":
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, list):
            args += [a for v in value for a in (flag, str(v))]
        elif value is not None:
            args += [flag, str(value)]
    return args


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
        store_format=STORE_FORMAT,
        args=lambda w: prepare_args(w.dataset) + raw_dir_arg(w.dataset),
    shell:
        "mcfl prepare {params.args:q} --out {output:q} > {log:q} 2>&1"


rule data_all:
    input:
        [store(d) for d in config["datasets"]],
