"""Tests of envlink.integrations (the training-loop adapters)."""
