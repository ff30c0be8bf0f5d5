# S2's data selection: solve rates of the base student and the external teacher, cut into difficulty subsets.


rule difficulty:
    input:
        lambda w: upstream_done(w.job),
    output:
        f"{ROOT}/difficulty/{{job}}/done.json",
    wildcard_constraints:
        job=id_pattern(job_ids("difficulty")),
    params:
        cfg=lambda w: job_config(w.job),
        out=lambda w: PLAN.jobs[w.job].out_dir,
    threads: THREADS
    priority: lambda w: PRIORITY[w.job]
    resources:
        **job_resources("difficulty"),
    log:
        f"{LOGS}/{{job}}.log",
    shell:
        "{OPDGRPO} difficulty --out {params.out} --config-json {params.cfg:q} > {log} 2>&1"
