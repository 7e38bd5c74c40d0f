"""Inference services: long-running HTTP servers reached through the console's gateway."""
