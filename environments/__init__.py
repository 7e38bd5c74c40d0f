"""Dev environments: a box to work on (SSH from a laptop), run as a job."""
