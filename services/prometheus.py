"""Services' metrics for /metrics: the gateway's traffic, counted where requests pass
(services.gateway), and at scrape time the replicas of every service by state and the
count the autoscaler wants (registered with console.metrics from services.receivers).

Only requests to a service that exists are counted (labelled by organisation and
service), so no caller can mint label values with made-up paths; a request that ends
before reaching a replica (401, 503, 504 while held) has an empty `revision`. The
duration runs from the request's arrival to the last byte of the answer, time held at
zero included: p50/p99 per revision are `histogram_quantile` over
`gpugeek_service_request_duration_seconds_bucket`."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

from django.db.models import Count
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from services.models import ReplicaState, Service, ServiceReplica

GATEWAY_REQUESTS = Counter(
    "gpugeek_service_requests",
    "Requests the services gateway answered, by organisation, service, revision of the "
    "replica that answered (empty: none did) and status code.",
    ["organisation", "service", "revision", "code"],
)
GATEWAY_DURATION = Histogram(
    "gpugeek_service_request_duration_seconds",
    "From a request's arrival at the services gateway to the last byte of its answer "
    "(time held while no replica was ready included), by revision.",
    ["organisation", "service", "revision"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
GATEWAY_IN_FLIGHT = Gauge(
    "gpugeek_service_requests_in_flight",
    "Requests the services gateway is handling now (held ones included), by service.",
    ["organisation", "service"],
    multiprocess_mode="livesum",
)
GATEWAY_HELD = Gauge(
    "gpugeek_service_requests_held",
    "Requests the services gateway holds while no replica of the service is ready.",
    ["organisation", "service"],
    multiprocess_mode="livesum",
)

Send = Callable[[dict], Awaitable[None]]


@dataclass
class GatewayRequest:
    """One routed request's labels and outcome, filled in as it goes."""

    organisation: str
    service: str
    code: int = 0  # the status sent; 0: none (the client went away first)
    revision: str = ""
    started: float = 0.0

    def watching(self, send: Send) -> Send:
        """`send`, noting the status of the answer's start."""

        async def watched(message: dict) -> None:
            if message["type"] == "http.response.start":
                self.code = message["status"]
            await send(message)

        return watched

    @contextlib.contextmanager
    def counted(self) -> Iterator[GatewayRequest]:
        """In flight while inside; counted and timed when done."""
        self.started = time.monotonic()
        in_flight = GATEWAY_IN_FLIGHT.labels(self.organisation, self.service)
        in_flight.inc()
        try:
            yield self
        finally:
            in_flight.dec()
            GATEWAY_REQUESTS.labels(
                self.organisation, self.service, self.revision, str(self.code)
            ).inc()
            GATEWAY_DURATION.labels(self.organisation, self.service, self.revision).observe(
                time.monotonic() - self.started
            )

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        gauge = GATEWAY_HELD.labels(self.organisation, self.service)
        gauge.inc()
        try:
            yield
        finally:
            gauge.dec()


class ServicesCollector:
    """Replicas by state and the wanted count, per service: two queries a scrape."""

    def collect(self) -> Iterator[Metric]:
        replicas = GaugeMetricFamily(
            "gpugeek_service_replicas",
            "Replicas of each service by state (stopped ones left out).",
            labels=["organisation", "service", "state"],
        )
        rows = (
            ServiceReplica.objects.exclude(state=ReplicaState.STOPPED)
            .order_by()
            .values_list("service__tenant__slug", "service__name", "state")
            .annotate(n=Count("id"))
        )
        for organisation, service, state, count in rows:
            replicas.add_metric([organisation, service, state], count)
        yield replicas
        wanted = GaugeMetricFamily(
            "gpugeek_service_desired_replicas",
            "The replica count each service's autoscaler wants now.",
            labels=["organisation", "service"],
        )
        for organisation, service, count in Service.objects.order_by().values_list(
            "tenant__slug", "name", "desired_replicas"
        ):
            wanted.add_metric([organisation, service], count)
        yield wanted
