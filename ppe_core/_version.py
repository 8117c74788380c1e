"""The ppe-core version; the first-party plugins move in lockstep with it."""

__version__ = "0.1.0"
