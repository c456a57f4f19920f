"""Experiment entry point and configuration files (not part of the installed library)."""
