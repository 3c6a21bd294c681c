"""Deploying Tally beyond one process: Kubernetes manifests for the repository's image, each pod's memory sized by
the ledger (`tally deploy k8s`, the k8s_* modules), and replicas on Ray Serve (the ray_* modules)."""
