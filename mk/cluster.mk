# The local Kubernetes cluster (issue 4): see docs/cluster.md.
#   make cluster           start it (idempotent: a no-op when healthy), building what is missing
#   make cluster-down      stop exactly what it started and remove its state
#   make cluster-binaries  build kube-*, kubectl, etcd, helm, CoreDNS, crictl into $TASKHERD_HOME/bin
#   make images            build the worker and operator images and import them into the cluster
#   make kind-binary       build sigs.k8s.io/kind (for the kind path, needs internet for node images)
#   make cluster-env       print the KUBECONFIG/kubectl/helm paths to `eval`
.PHONY: cluster cluster-down cluster-binaries images kind-binary cluster-env

cluster-binaries:
	bash e2e/cluster/build.sh

cluster:
	bash e2e/cluster/up.sh

cluster-down:
	bash e2e/cluster/down.sh

images:
	bash images/build.sh

kind-binary:
	bash e2e/cluster/build.sh kind

cluster-env:
	@bash -c 'source e2e/cluster/lib.sh; echo "export KUBECONFIG=$$KUBECONFIG_PATH"; \
	  echo "export PATH=$$K8S_BIN:$$HELM_BIN:$$ETCD_BIN:\$$PATH"'

# The cluster smoke tests (tests/cluster, marker `cluster`) need it. When it cannot come up, make
# test stops here with the exact error, rather than skipping the tests.
TEST_PREREQS += cluster
