"""The run directory and the sweep directory: file layout, ownership, the RunDir."""
