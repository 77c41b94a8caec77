"""Helpers for the e2e and cluster tests: which cluster, kubectl/helm, bounded waits."""
