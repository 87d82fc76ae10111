"""Measurement: per-iteration phase timing (and, later, communication and resource traces)."""
