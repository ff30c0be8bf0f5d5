"""The DAG's stages besides post-training, each a job the rules run: the base models (:mod:`~opdgrpo.stages.pretrain`
for the tiny world's scratch models, :mod:`~opdgrpo.stages.hub_models` for hub checkpoints and weightless random
stand-ins, both evaluated at step 0) and S2's difficulty selection (:mod:`~opdgrpo.stages.difficulty`). They are
built from the trainer's parts (:mod:`opdgrpo.train`). What the jobs read from the Hugging Face hub is checked at each
job's start (:mod:`~opdgrpo.stages.hub_cache`) and fetched beforehand by ``opdgrpo fetch`` (:mod:`~opdgrpo.stages.fetch`).
"""
