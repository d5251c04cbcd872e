"""The functional core of recovery: classify outcomes, decide, back off, report. No I/O here."""
