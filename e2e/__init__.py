"""End-to-end tests on a kind cluster (pytest marker ``e2e``; see e2e/README.md).

Modules: settings (the environment, read once), proc (bounded commands and waits), tools (what
must be installed), kind (cluster and images), k8s (kubectl/helm, port-forward), install (the Helm
release and Cluster readiness), resources (Topic/ConsumerGroup objects, readiness rules), jobs
(in-cluster producer/consumer Jobs running incluster/tmqload.py), scenario (steps the tests
share), spark (the spark-operator and spark/manifests adapted), diagnostics (failure dumps).
The scenarios are the test_*.py modules; the session fixtures live in conftest.py.
"""
