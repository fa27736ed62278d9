"""API replicas sharing one PostgreSQL database: heartbeats and ownership (coordination.py), reading and
forwarding to another replica's job (remote.py), Idempotency-Key claims (claims.py), and cluster.py,
the implementation of the job layer's `Cluster` interface. Loaded only when ZFAB_API_DB is PostgreSQL."""
