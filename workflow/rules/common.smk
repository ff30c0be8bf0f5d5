# Helpers shared by the rules: job lookup, resolved configs as params, upstream inputs.
import json
import re


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
