"""The e2e suite's own services, running in the cluster: Redis, RabbitMQ (with its management
plugin; one node, or a cluster for quorum queues), PostgreSQL, Alertmanager and Prometheus, in the
namespace `taskherd-services`, from the image images/services builds. docs/services.md explains
how pods and this host reach them.

    from e2e.lib import cluster as clusters
    from e2e.services import access, deploy

    cluster = clusters.resolve()
    services = deploy.up(cluster)                 # idempotent; services.pods: the URLs pods use
    with access.reach(cluster, services) as host: # tunnels; host: the URLs this host uses
        ...

Command line: `python -m e2e.services up|down|status|urls|forward|redis-db|vhost|database`.
"""
