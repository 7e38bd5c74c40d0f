"""`manage.py ssh_gateway`: run the SSH gateway to dev environments (environments.gateway)."""

import logging

from django.conf import settings
from django.core.management.base import BaseCommand

from environments.gateway import gateway_run


class Command(BaseCommand):
    help = "Run the SSH gateway (jump host) to dev environments."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=settings.SSH_GATEWAY_HOST)
        parser.add_argument("--port", type=int, default=settings.SSH_GATEWAY_PORT)

    def handle(self, *args, host, port, **options):
        logging.basicConfig(level=logging.INFO, format="%(asctime)s ssh-gateway: %(message)s")
        gateway_run(host=host, port=port)
