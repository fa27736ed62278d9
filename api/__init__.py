"""The HTTP control plane over the fabric: `api.http.app.create_app()` builds the FastAPI app and
`zfab api` runs it (api/server.py). Package map and import direction: docs/architecture.md."""
