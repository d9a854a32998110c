"""Readers for trace files/dicts and memory snapshots -> model objects.

All format quirks live here."""
