"""Where jobs and schedules outlive the process: the store interface, SQLite, PostgreSQL (schema
migrations included) and the persister that writes the job table behind the request path."""
