"""Services on a Kubernetes cluster: their objects (manifests) and the reconcile
pass that keeps them and mirrors their pods as replicas (reconcile)."""
