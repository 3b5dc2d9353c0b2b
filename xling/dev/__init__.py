"""Developer tooling: tiny offline models, a local SeaweedFS S3 server and a local multi-node
Ray cluster, for tests, benchmarks and the demo. No job on a cluster imports it."""
