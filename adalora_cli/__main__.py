"""``python -m adalora_cli`` (what ``torchrun -m adalora_cli train ...`` runs on each rank)."""

from .cli import app

app()
