# The kind cluster: see docs/cluster.md, "kind".
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
	  $(STEPS) with-summary "make kind-image" -- bash images/kind/build.sh; \
	else echo "TASKHERD_KIND_NODE_IMAGE=$$TASKHERD_KIND_NODE_IMAGE: nothing to build"; fi

kind-cluster: kind-image images
	@$(STEPS) with-summary "make kind-cluster" -- bash e2e/kind/up.sh

kind-cluster-down:
	bash e2e/kind/down.sh

kind-env:
	@bash -c 'source e2e/kind/lib.sh; echo "export KUBECONFIG=$$KIND_KUBECONFIG"; \
	  echo "export PATH=$$K8S_BIN:$$HELM_BIN:\$$PATH"; \
	  if kind_built_here; then echo "export DOCKER_HOST=unix://$$KIND_DOCKER_SOCK"; fi'

workflow-lint:
	bash e2e/cluster/build.sh actionlint
	bash -c 'source e2e/cluster/lib.sh; "$$BIN_ROOT/actionlint-$$ACTIONLINT_VERSION/actionlint" -no-color'

# E2E_CLUSTER=kind make test brings the kind cluster up before pytest (as cluster-for-tests does the
# local one): if that fails the other tests still run and the cluster tests fail with up.sh's output.
ifeq ($(E2E_CLUSTER),kind)
TEST_PREREQS += kind-cluster-for-tests
endif
.PHONY: kind-cluster-for-tests
kind-cluster-for-tests:
	@mkdir -p "$(TASKHERD_HOME)"; set -o pipefail; if ! { bash images/build.sh && bash e2e/kind/up.sh; } 2>&1 | tee "$(TASKHERD_HOME)/kind-up.log"; then \
	  echo "make kind-cluster FAILED (log: $(TASKHERD_HOME)/kind-up.log); the cluster tests will fail with this error" >&2; \
	fi

# The tests that need kind (marker kind: node faults) or a network that enforces NetworkPolicy
# (marker networkpolicy) fail on other clusters, saying why; `make test` deselects them there, and
# says so. E2E_CLUSTER=kind make test runs everything on the kind cluster.
ifneq ($(E2E_CLUSTER),kind)
test-run: PYTEST_ARGS += -m 'not kind and not networkpolicy'
TEST_PREREQS += kind-tests-deselected
endif
.PHONY: kind-tests-deselected
kind-tests-deselected:
	@echo "make test: tests marked kind and networkpolicy are deselected: they need the kind cluster (E2E_CLUSTER=kind make test)"
