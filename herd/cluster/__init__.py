"""Many hosts on one machine (network namespaces, shaped links) and a Ray cluster on them:
the harness of the multi-node tests and of benchmarks/netns_cluster.py (docs/netns-cluster.md)."""
