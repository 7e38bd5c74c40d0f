"""GpuGeek: Python SDK for the GpuGeek GPU-cloud console API."""

from gpugeek.client import Client
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
from gpugeek.models import Budget, Estimate, GpuType, Invoice, Job, LogLine, NodePool, Offer

__version__ = "0.1.0"
__all__ = [
    "APIError", "AuthenticationError", "Budget", "BudgetExceeded", "Client", "Cluster",
    "Conflict", "ConnectionFailed", "Estimate", "GpuGeekError", "GpuType", "Invoice", "Job",
    "LogLine", "NodePool", "NotFound", "Offer", "QuotaExceeded", "ServerError", "Timeout",
    "ValidationError", "__version__",
]  # fmt: skip
