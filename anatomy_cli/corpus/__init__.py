"""Whole corpora: sharded runs with mergeable float64 statistics, Parquet shards, resume, Ray workers.

May import analyses, engine, models, text and errors; never cli or output.
"""
