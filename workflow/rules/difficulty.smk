# S2's data selection: solve rates of the base student and the external teacher, cut into difficulty subsets.
# tokenizer + both base models -> difficulty/<job>/subsets.json


rule difficulty:
    input:
        tokenizer=consumed("tokenizer"),
        models=consumed("models"),  # the base student and the external teacher, sampled in turn
    output:
        f"{ROOT}/difficulty/{{job}}/done.json",
    log:
        f"{LOGS}/{{job}}.log",
    wildcard_constraints:
        job=id_pattern(job_ids("difficulty")),
    priority: lambda w: PRIORITY[w.job]
    threads: THREADS
    resources:
        **job_resources("difficulty", lambda w: w.job),
    params:
        cfg=lambda w: job_config(w.job),
        out=lambda w: PLAN.jobs[w.job].out_dir,
    shell:
        "{OPDGRPO} difficulty --out {params.out} --config-json {params.cfg:q} > {log} 2>&1"
