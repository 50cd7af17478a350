"""Input/output: user inputs into Targets, the worklist table, atomic writes."""
