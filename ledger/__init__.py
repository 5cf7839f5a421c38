"""Ledger files: write-ahead files of open ledgers, sealed Parquet ledgers, compacted ledgers.

This package knows nothing of topics, HTTP or the metadata database: it is handed paths
(see :mod:`ledger.paths`) and ids, and it keeps bytes safe.
"""
