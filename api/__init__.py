"""The HTTP control plane: `api.app.create_app()` builds the FastAPI app; `zfab api` runs it (api.server)."""
