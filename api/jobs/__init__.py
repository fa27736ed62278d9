"""The job table and its rules: records and their states, admission, filters, submission, waiting,
recovery after a restart, and the `Cluster` interface through which other replicas' jobs are reached."""
