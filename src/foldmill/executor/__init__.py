"""The Ray replica executor: fold a shard of targets on every GPU in reach, streaming results to disk.

    run.fold_targets(items, outdir, table, model, executor, staging)   # the entry point

- settings   `model:` / `executor:` config sections as dataclasses
- plan       skip finished targets (done marker + same inputs, model, recipe), longest first; token-budget rejections
- cluster    start a lean local Ray instance or join one; create the actor pools
- worker     the actor behind every stage; errors become outcomes, never dead actors
- engine     the stages: featurize -> model replica (fast path on GPU) -> write
- transfer   lossless packing of feature dicts between featurizer and replica
- scheduler  the driver loop: replicas join as they load, bounded queues, budgets, crash/retire handling
- faults     what an exception means: failed, rejected, or retire the replica; why a worker died (out of memory)
- interrupts SIGINT / SIGTERM stop a run cleanly (no new work, Ray shut down, finished targets kept)
- records    the per-target journal and the fold table
- progress   live progress line and closing summary
"""
