"""A package whose module runs the all-reduce job with ``python -m pkg.job``."""
