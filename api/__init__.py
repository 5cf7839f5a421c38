"""HTTP: the FastAPI app, its routers and shapes, error mapping, and the Python client."""
