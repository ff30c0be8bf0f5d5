# OPD runs: external-teacher, self-teacher and multi-teacher on-policy distillation.


rule opd:
    input:
        lambda w: upstream_done(w.run),
    output:
        f"{ROOT}/runs/{{run}}/done.json",
    wildcard_constraints:
        run=id_pattern(job_ids("train", "opd")),
    params:
        cfg=lambda w: job_config(w.run),
        out=lambda w: PLAN.jobs[w.run].out_dir,
    threads: THREADS
    priority: lambda w: PRIORITY[w.run]
    resources:
        **job_resources("train"),
    log:
        f"{LOGS}/{{run}}.log",
    shell:
        "{TRAIN_CMD} train --out {params.out} --config-json {params.cfg:q} > {log} 2>&1"
