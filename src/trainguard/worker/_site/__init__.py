"""The folder put on a worker's ``PYTHONPATH`` for automatic instrumentation (see ``sitecustomize.py``).

This file only makes the folder part of the installed package; the folder itself is never imported.
"""
