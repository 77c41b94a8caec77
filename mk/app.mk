# Your own app's image (docs/your-app.md): a Dockerfile starting FROM the taskherd worker image,
# built without network in the project's private builder and put where the e2e entry point's cluster
# runs it (local: containerd, imported again at every cluster start; kind: loaded into each node;
# your own cluster: pushed to the registry IMAGE names). scripts/app-image.sh does the work.
#   make app-image APP=path/to/app IMAGE=taskherd.local/myapp:1   build and load (reused when unchanged)
#   make app-image APP=… IMAGE=… DOCKERFILE=path                  a Dockerfile not at APP/Dockerfile
#   make app-images                                               the images kept across cluster restarts
#   make app-image-forget IMAGE=…                                 stop importing IMAGE at cluster start
.PHONY: app-image app-images app-image-forget

app-image:
	@test -n "$(APP)" || { echo "make app-image: APP is not set (the directory of your app: its code and Dockerfile), e.g. make app-image APP=examples/payments IMAGE=taskherd.local/payments:1" >&2; exit 2; }
	@test -n "$(IMAGE)" || { echo "make app-image: IMAGE is not set (name:tag, the tag not latest), e.g. IMAGE=taskherd.local/myapp:1" >&2; exit 2; }
	@$(STEPS) with-summary "make app-image" -- bash scripts/app-image.sh $(if $(DOCKERFILE),-f "$(DOCKERFILE)") "$(APP)" "$(IMAGE)"

app-images:
	@bash scripts/app-image.sh --list

app-image-forget:
	@test -n "$(IMAGE)" || { echo "make app-image-forget: IMAGE is not set (one of: make app-images)" >&2; exit 2; }
	@bash scripts/app-image.sh --forget "$(IMAGE)"
