"""Where every second of a run went: goodput (ETTR), plausibility of records, where attempts resumed."""
