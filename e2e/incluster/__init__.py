"""Code that runs inside the kind cluster (mounted into Jobs from a ConfigMap, not imported there)."""
