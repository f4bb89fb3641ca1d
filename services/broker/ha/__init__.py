"""High availability of a broker group (issue 17): replicas, election and fencing.

- ``coordination``: the store election runs on (one compare-and-swap record per group, leases,
  watches) and the record; ``etcd`` and ``kubernetes`` are its two backends.
- ``election``: the Elector (campaigns, roles, ``may_acknowledge``, hand-over) and its pure decisions.
- ``protocol`` / ``replication``: the replication wire codec, and the master server / follower
  client streaming the CommitLog with epochs and truncation.
- ``replica``: the ReplicaService the broker builds with ``--coordination``: election wired to
  replication and to the brokerId it registers.
- ``metadata`` / ``metalog`` / ``metaapply``: topics, groups, offsets and delay/checker progress as
  records of the replicated log: their codec, the master's recorder, the follower's applier.

This package knows nothing of the wire front-ends; the store knows nothing of it.
"""
