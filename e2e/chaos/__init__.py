"""The chaos suite: every fault a worker fleet meets, on both brokers, judged by a ledger.

    faults/*.yaml   one fault per file, declarative (spec.py reads and checks them)
    actions/        the vocabulary of those files: what each `fault.action` does and how it ends
    app/            the ledger app the faults hit (Celery on taskherd, installed with the chart)
    world.py        the services a run breaks (its own Redis, RabbitMQ, PostgreSQL) and each app's corner
    deploy.py       the ledger on the cluster: tables, Secrets, code, chart, outbox relay
    workload.py     the producers (direct and through the outbox) and the record of what was sent
    observe.py      the watch: samples for the timeline, the picture triggers and actions act on
    steady.py       steady state and "every task has its outcome", as pure decisions
    checker.py      the Jepsen-style verdict (pure): lost, duplicated, recovered, unexpected, DLQ
    ledger.py       reading effects, attempts and the DLQ for the checker
    runner.py       one scenario, start to verdict; the ledger's installation per broker
    suite.py        a run of the matrix; soak.py: random faults against a continuous load
    report.py       summary.json, timeline.png, the matrix (terminal, Markdown, docs/chaos.md)
    nodes.py        what only a node can do: signal a container's PID 1, iptables in a pod, a kubelet restart

`python -m e2e.chaos run|soak|list|down`; `make chaos`, `make chaos-soak`; docs/chaos.md.
"""
