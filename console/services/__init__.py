# Step one of splitting console/services.py into modules by what they own: the file moved
# whole (history follows); the next commit splits it and points every caller at its module.
from console.services.invitations import *  # noqa: F403
