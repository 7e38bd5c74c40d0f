"""GpuGeek: Python SDK for the GpuGeek GPU-cloud console API."""

from gpugeek.client import Client, recommend
from gpugeek.cluster import Cluster
from gpugeek.errors import (
    APIError,
    AuthenticationError,
    BudgetExceeded,
    Conflict,
    ConnectionFailed,
    GpuGeekError,
    NotFound,
    QuotaExceeded,
    ServerError,
    Timeout,
    ValidationError,
)
from gpugeek.models import (
    Budget,
    Environment,
    Estimate,
    GpuOption,
    GpuType,
    Invoice,
    Job,
    LogLine,
    NodePool,
    Offer,
    Recommendation,
    SshKey,
)

__version__ = "0.1.0"
__all__ = [
    "APIError", "AuthenticationError", "Budget", "BudgetExceeded", "Client", "Cluster",
    "Conflict", "ConnectionFailed", "Environment", "Estimate", "GpuGeekError", "GpuOption",
    "GpuType", "Invoice", "Job", "LogLine", "NodePool", "NotFound", "Offer", "QuotaExceeded",
    "Recommendation", "ServerError", "SshKey", "Timeout", "ValidationError", "__version__",
    "recommend",
]  # fmt: skip
