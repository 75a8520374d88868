"""Sweeps: plan the grid, launch it (locally or on SLURM), show its status."""
