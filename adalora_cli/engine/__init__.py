"""Everything between a config and a finished run directory.

``build`` (config -> model, data, method), ``schedule`` (T and the lr schedule), ``order``
(resumable batch order), ``step`` (one optimizer step), ``checkpoint`` (the training state on
disk), ``signals`` (preemption), ``distributed`` and ``sharding`` (several processes, whole
or sharded models) and ``loop`` (the one training loop). Nothing is imported
here, so ``adalora --help`` and the sweep planner stay light.
"""
