"""The top of the house: the ``compactor`` console script (``main``), the FastAPI app, its
routers and shapes, error mapping, and the Python client (``client``, with ``cli``: the base
install)."""
