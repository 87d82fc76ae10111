"""Stragglers: which rank held the others back, by how much, and what-if without it."""
