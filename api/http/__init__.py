"""The HTTP face: the FastAPI app (app.py), its routes (routes/), middleware, auth, problem documents
and the packaged Swagger UI. The only package of api/ that imports FastAPI's request machinery."""
