"""Tracks (data sets); the registry lives on branch `bench` (this makes the package importable)."""
