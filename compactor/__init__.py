"""The two-phase topic compactor on Apache Spark.

``TwoPhaseCompactor(spark).compact(job)`` writes the latest record of every key of a topic
into a new compacted ledger and returns a ``CompactionResult``; the caller commits it.
``get_spark()`` gives the process's one SparkSession.
"""

from compactor.result import CompactionJob, CompactionResult
from compactor.spark import get_spark
from compactor.two_phase import TwoPhaseCompactor

__all__ = ["CompactionJob", "CompactionResult", "TwoPhaseCompactor", "get_spark"]
