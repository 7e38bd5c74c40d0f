"""Test doubles that speak real protocols (HTTP) to real client libraries, and their
fixtures. The Kubernetes simulator is product code now: sandbox.kubesim."""
