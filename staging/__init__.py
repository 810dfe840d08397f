"""lading's library: context checks, stores, sync, hooks and packing. Never prints or prompts."""

__version__ = "0.1.0"
