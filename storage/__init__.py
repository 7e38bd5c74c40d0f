"""Volumes: named, sized storage a tenant keeps between jobs and mounts into them."""
