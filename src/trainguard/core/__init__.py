"""The language every part speaks: event records and files, the worker<->agent protocol, the run
folder, names, safe files, clocks, Table 5 and interval theory. Imports nothing else of trainguard."""
