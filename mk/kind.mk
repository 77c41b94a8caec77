# The kind cluster (issue 14): see docs/cluster.md, "kind".
#   make kind-image          the kind node image, built here from the project's Kubernetes (no registry)
#   make kind-cluster        the `taskherd` kind cluster: 1 control plane + 2 workers, kube-router,
#                            the worker/operator (and services) images loaded
#   make kind-cluster-down   delete it (and stop the docker daemon it ran in)
#   make kind-env            print KUBECONFIG and PATH for kubectl/helm against it, to `eval`
#   make workflow-lint       actionlint on .github/workflows
# With TASKHERD_KIND_NODE_IMAGE=kindest/node:<tag> the same targets use a pulled node image and the
# environment's docker instead (kind-image is then a no-op). Tests and the demo run on it with
# E2E_CLUSTER=kind.
.PHONY: kind-image kind-cluster kind-cluster-down kind-env workflow-lint

kind-image:
	@if [ -z "$$TASKHERD_KIND_NODE_IMAGE" ] || [[ "$$TASKHERD_KIND_NODE_IMAGE" == taskherd.local/* ]]; then \
	  bash images/kind/build.sh >/dev/null; \
	else echo "TASKHERD_KIND_NODE_IMAGE=$$TASKHERD_KIND_NODE_IMAGE: nothing to build"; fi

kind-cluster: kind-image images
	bash e2e/kind/up.sh

kind-cluster-down:
	bash e2e/kind/down.sh

kind-env:
	@bash -c 'source e2e/kind/lib.sh; echo "export KUBECONFIG=$$KIND_KUBECONFIG"; \
	  echo "export PATH=$$K8S_BIN:$$HELM_BIN:\$$PATH"; \
	  if kind_built_here; then echo "export DOCKER_HOST=unix://$$KIND_DOCKER_SOCK"; fi'

workflow-lint:
	bash e2e/cluster/build.sh actionlint
	bash -c 'source e2e/cluster/lib.sh; "$$BIN_ROOT/actionlint-$$ACTIONLINT_VERSION/actionlint" -color=never'

# The tests that need kind (marker kind: node faults) or a network that enforces NetworkPolicy
# (marker networkpolicy) fail on other clusters, saying why; `make test` deselects them there, and
# says so. E2E_CLUSTER=kind make test runs everything on the kind cluster.
ifneq ($(E2E_CLUSTER),kind)
test: PYTEST_ARGS += -m 'not kind and not networkpolicy'
TEST_PREREQS += kind-tests-deselected
endif
.PHONY: kind-tests-deselected
kind-tests-deselected:
	@echo "make test: tests marked kind and networkpolicy are deselected: they need the kind cluster (E2E_CLUSTER=kind make test)"
