# Base stage: the shared tokenizer, the own tokenizer of a model of another family (models.<name>.tokenizer, e.g.
# Olmo-3 next to Qwen3), and each model's pretraining (not counted as post-training).


rule tokenizer:
    output:
        f"{ROOT}/base/tokenizer/done.json",
    log:
        f"{LOGS}/tokenizer.log",
    resources:
        **job_resources("tokenizer"),
    params:
        cfg=lambda w: job_config("tokenizer"),
        out=f"{ROOT}/base/tokenizer",
    shell:
        "{OPDGRPO} tokenizer --out {params.out} --config-json {params.cfg:q} > {log} 2>&1"


rule model_tokenizer:
    output:
        f"{ROOT}/base/tokenizer-{{owner}}/done.json",
    log:
        f"{LOGS}/tokenizer-{{owner}}.log",
    wildcard_constraints:
        owner=id_pattern([j.label for j in PLAN.by_kind("tokenizer") if j.label]),
    resources:
        **job_resources("tokenizer"),
    params:
        cfg=lambda w: job_config(f"tokenizer-{w.owner}"),
        out=lambda w: PLAN.jobs[f"tokenizer-{w.owner}"].out_dir,
    shell:
        "{OPDGRPO} tokenizer --out {params.out} --config-json {params.cfg:q} > {log} 2>&1"


rule pretrain:
    input:
        tokenizer=consumed("tokenizer"),
    output:
        f"{ROOT}/base/{{model}}/done.json",
    log:
        f"{LOGS}/base-{{model}}.log",
    wildcard_constraints:
        model=id_pattern([j.label for j in PLAN.by_kind("base")]),
    priority: lambda w: PRIORITY[f"base-{w.model}"]
    threads: THREADS
    resources:
        **job_resources("base", lambda w: f"base-{w.model}"),
        **stop_resources(lambda w: f"base-{w.model}"),
    params:
        cfg=lambda w: job_config(f"base-{w.model}"),
        out=lambda w: PLAN.jobs[f"base-{w.model}"].out_dir,
    shell:
        BASE_CMD + " pretrain --out {params.out} --config-json {params.cfg:q} "
        "--collective-timeout {resources.collective_timeout_s} > {log} 2>&1"
