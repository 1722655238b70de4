"""Test helpers: shared functions for the test modules (``from helpers.common import ...``) and hooks
that training subprocesses import through ``custom_imports`` (this folder is on their PYTHONPATH)."""
