//go:build tools

// Package tools pins the commands this wrapper module builds (see e2e/cluster/build.sh).
package tools

import (
	_ "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"
)
