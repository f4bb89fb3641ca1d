"""High availability of a broker group (issue 17): replicas, election and fencing.

``coordination`` defines the store election runs on (one compare-and-swap record per group, leases,
watches) and the record; ``etcd`` and ``kubernetes`` are its two backends. This package knows
nothing of the wire front-ends; the store knows nothing of it.
"""
