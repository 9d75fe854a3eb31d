"""Probes: one per signal, each switching its global state on only while a region records."""
