"""``adalora tune``: a per-method search over config keys, trials as sweep runs."""
