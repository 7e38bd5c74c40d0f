"""Test doubles that speak real protocols (HTTP) to real client libraries."""
