"""Tests of the sandbox cluster (sandbox/)."""
