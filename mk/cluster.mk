# The local Kubernetes cluster: see docs/cluster.md.
#   make cluster           start it (idempotent: a no-op when healthy), building what is missing
#   make cluster-down      stop exactly what it started and remove its state
#   make cluster-binaries  build kube-*, kubectl, etcd, helm, CoreDNS, crictl into $TASKHERD_HOME/bin
#   make images            build the worker and operator images and import them into the cluster
#   make kind-binary       build sigs.k8s.io/kind (for the kind path, needs internet for node images)
#   make cluster-env       print the KUBECONFIG/kubectl/helm paths to `eval`
#   make cluster-status    what runs, by PID, and its memory
.PHONY: cluster cluster-down cluster-binaries images kind-binary cluster-env

cluster-binaries:
	@$(STEPS) with-summary "make cluster-binaries" -- bash e2e/cluster/build.sh

cluster:
	@$(STEPS) with-summary "make cluster" -- bash e2e/cluster/up.sh

cluster-down:
	bash e2e/cluster/down.sh

images:
	@$(STEPS) with-summary "make images" -- bash images/build.sh

kind-binary:
	bash e2e/cluster/build.sh kind

cluster-env:
	@bash -c 'source e2e/cluster/lib.sh; echo "export KUBECONFIG=$$KUBECONFIG_PATH"; \
	  echo "export PATH=$$K8S_BIN:$$HELM_BIN:$$ETCD_BIN:\$$PATH"'

# The cluster tests (marker `cluster`) need it, and the worker/operator images (rebuilt only when
# their sources changed). If the cluster cannot come up, make test
# goes on (the other tests still run) and the cluster tests FAIL with the exact error: they show
# the tail of $(TASKHERD_HOME)/cluster-up.log, which this step writes. Nothing is skipped.
TEST_PREREQS += cluster-for-tests
.PHONY: cluster-for-tests cluster-status
cluster-for-tests:
	@mkdir -p "$(TASKHERD_HOME)"; set -o pipefail; \
	src=$$(PYTHONPATH=. python3 -c 'from e2e.lib.cluster import selected_source; print(selected_source())'); \
	if [ "$$src" != local ]; then up=true; echo "tests use the $$src cluster: the local one is not started"; \
	else up="bash e2e/cluster/up.sh"; fi; \
	if ! { $$up && bash images/build.sh; } 2>&1 | tee "$(TASKHERD_HOME)/cluster-up.log"; then \
	  echo "make cluster / make images FAILED (log: $(TASKHERD_HOME)/cluster-up.log); the cluster tests will fail with this error" >&2; \
	fi

cluster-status:
	bash e2e/cluster/status.sh
