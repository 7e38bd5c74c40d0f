"""Checkpoints: the installation's checkpoint store and the protocol jobs write to it.

A job gets its own prefix `<tenant>/<job>/` in the store. A checkpoint is the folder
`<prefix><step>/`; it counts only once `<prefix><step>/gpugeek-checkpoint.json` (the
manifest: step, time, files with sizes, optional metrics) is there and every file it
lists exists with its size, so an upload cut off half-way is never offered for resume.
`store` talks to the store (a folder or S3 through boto3); the services that use it
live in `jobs.services.checkpoints`.
"""
