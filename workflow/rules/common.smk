# Helpers shared by the rules: job lookup, resolved configs as params, upstream inputs.
import json
import re
import shlex
import sys


def job_ids(kind, method=None):
    return [
        j.id
        for j in PLAN.jobs.values()
        if j.kind == kind and (method is None or j.config["method"]["name"] == method)
    ]


def id_pattern(ids):
    """A wildcard constraint matching exactly these ids (never a prefix of another)."""
    return "|".join(re.escape(i) for i in ids) or "(?!x)x"


def job_config(job_id):
    """The job's resolved config, canonical JSON: Snakemake reruns the job when it changes."""
    return json.dumps(PLAN.jobs[job_id].config, sort_keys=True)


def upstream_done(job_id):
    return [PLAN.jobs[u].done for u in PLAN.jobs[job_id].upstream]



LOGS = f"{ROOT}/logs"
THREADS = int(CFG["threads"])

# The package's CLI, run by the interpreter that runs Snakemake (so it works without an activated venv);
# `--config opdgrpo_cmd=...` replaces it, e.g. for a cluster with its own environment.
OPDGRPO = config.get("opdgrpo_cmd", f"{shlex.quote(sys.executable)} -m opdgrpo.cli")


def job_resources(kind):
    """Cluster resources of one kind of job (conf `resources.<kind>`): runtime, mem_mb, cpus_per_task, gpu.
    gpu 0 asks for none; gpu > 0 adds the site's GPU model when the config names one (`--config gpu_model=h100`)."""
    res = dict(CFG.get("resources", {}).get(kind, {}))
    if not res.get("gpu"):
        res.pop("gpu", None)
    elif config.get("gpu_model"):
        res["gpu_model"] = config["gpu_model"]
    return res


# Jobs that only copy files run where Snakemake runs, never as cluster jobs.
localrules:
    all,
    publish,
