"""taskherd.operator — the kopf operator that scales WorkerPools and pages on dead letters."""
