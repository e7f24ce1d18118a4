"""Clustering helpers: initial cluster centres for multi-center methods."""
