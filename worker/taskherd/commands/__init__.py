"""The `taskherd` subcommands that run outside the pod's probes: dlq, outbox, exporter, recover.
Registered in taskherd.cli with the pod-side ones (taskherd.pod: probe, drain)."""
