//go:build tools

// Package tools pins the commands this wrapper module builds (see e2e/cluster/build.sh).
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
