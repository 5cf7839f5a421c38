"""The C extension only; everything else about the distribution is in pyproject.toml.

(Here rather than in pyproject.toml's ``[tool.setuptools] ext-modules``, which setuptools still
calls experimental.) ``ledger._batch_codec`` decodes the members of Pulsar batches in bulk
(``ledger/batch_codec.py``). Optional: where it cannot be compiled (no C compiler or Python
headers) the install goes on and its pure-Python walk (``ledger/batch_walk.py``) serves, correct
and slower (``ledger.batch_codec.native()`` says which; ``make install`` warns).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "ledger._batch_codec",
            sources=["ledger/_batch_codec.c"],
            optional=True,
        )
    ]
)
