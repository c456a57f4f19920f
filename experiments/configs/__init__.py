"""Configuration files: `get_config()` each, on top of `base.py`."""
