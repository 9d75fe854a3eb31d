"""Renderings of measured results: failure text, terminal summary, JSON file."""
