"""Where services plug into the rooms below them: their scrape-time metrics (replicas by
state, the wanted count) on /metrics. Connected once, from ServicesConfig.ready()."""

from __future__ import annotations

from console.metrics import scrape_collector_register
from services.prometheus import ServicesCollector


def connect() -> None:
    scrape_collector_register("services", ServicesCollector())
