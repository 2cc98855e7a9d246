"""The reference-server tests use the shared fixtures of tests/conftest.py."""
