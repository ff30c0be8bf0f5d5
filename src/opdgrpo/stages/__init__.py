"""The DAG's stages besides post-training, each a job the rules run: the base models (:mod:`~opdgrpo.stages.pretrain`
for the tiny world's scratch models, :mod:`~opdgrpo.stages.hub_models` for hub checkpoints and weightless random
stand-ins, both evaluated at step 0) and S2's difficulty selection (:mod:`~opdgrpo.stages.difficulty`). They are
built from the trainer's parts (:mod:`opdgrpo.train`).
"""
