# The e2e services in the cluster (docs/services.md): Redis, RabbitMQ, PostgreSQL, Alertmanager and
# Prometheus in the namespace taskherd-services of the cluster the e2e suite resolves.
#   make cluster-services                    deploy or repair them (`make demo` does it too)
#   make cluster-services RABBITMQ_NODES=3   RabbitMQ as a 3-node cluster (quorum queues)
#   make cluster-services-down               remove them
.PHONY: cluster-services cluster-services-down

cluster-services: venv
	$(PY) -m e2e.services up $(if $(RABBITMQ_NODES),--rabbitmq-nodes $(RABBITMQ_NODES))

cluster-services-down: venv
	$(PY) -m e2e.services down
