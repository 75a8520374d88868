"""Using a finished run: load it back, export (PEFT, merged), re-score, predict."""
