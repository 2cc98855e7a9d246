"""Tests of envlink."""
