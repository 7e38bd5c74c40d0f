"""A queue that explains itself: each queued job's reason and expected start, each
running job's expected end, from runtime predictions over the tenant's history
(`runtime`), a simulation of the queue (`simulation`) and the reads that feed them
(`selectors`)."""
