"""Tests of commflow.bench and `commflow bench`."""
