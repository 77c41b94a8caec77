//go:build tools

// Package tools pins the commands this wrapper module builds (see e2e/cluster/build.sh).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kubeadm"
)
