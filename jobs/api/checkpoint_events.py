"""What a job asks the console with its own token (Bearer), not a console session or API
token (a job holds neither): POST /api/v1/jobs/<id>/checkpoint-events, the `checkpoint`
event the SDK's helper posts after writing a manifest, and GET
/api/v1/jobs/<id>/checkpoint-credentials, its renewed temporary store credentials."""

from __future__ import annotations

import logging

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import Throttled
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from console.api.errors import error_response
from console.api.fields import StrictCharField
from console.api.schema import ErrorSerializer
from console.service_errors import ServiceError
from jobs import services
from jobs.checkpoints.events import EVENT_BURST, EVENT_INTERVAL
from jobs.services.checkpoints import CheckpointEventTooSoon

log = logging.getLogger(__name__)


def _job_token(request) -> str:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


_NO_TOKEN = "The job's checkpoint token is missing."


class CheckpointEventView(APIView):
    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(
        request=None,
        responses={
            200: inline_serializer(
                "CheckpointEventResult",
                {
                    "step": serializers.IntegerField(
                        allow_null=True, help_text="the newest complete checkpoint found"
                    ),
                    "pruned": serializers.ListField(child=serializers.IntegerField()),
                },
            ),
            401: ErrorSerializer,
            404: ErrorSerializer,
            409: ErrorSerializer,
            429: ErrorSerializer,
            503: ErrorSerializer,
        },
        auth=[],
    )
    def post(self, request, pk: int):
        """Look at the job's store prefix now: record its newest complete checkpoint and
        prune the older ones. The body is ignored (nothing a job says is trusted). Each job
        has a burst of events, then a sustained rate; beyond it 429 with Retry-After (the
        periodic scan records the checkpoints meanwhile)."""
        token = _job_token(request)
        if not token:
            return error_response(401, _NO_TOKEN, "not_authenticated")
        try:
            record = services.job_checkpoint_event(token=token, job_id=int(pk))
        except ServiceError:
            raise
        except CheckpointEventTooSoon as too_soon:
            raise Throttled(
                wait=too_soon.retry_after,
                detail=f"A job's checkpoint events are taken {EVENT_BURST} at once, then one "
                f"per {EVENT_INTERVAL.total_seconds():g} s; the console's periodic scan "
                "records this checkpoint meanwhile.",
            ) from None
        except Exception:  # the store (S3, a folder): the job's next event or the scan retries
            log.exception("job %s: the checkpoint event could not read the store", pk)
            return error_response(
                503, "The checkpoint store could not be read just now.", "unavailable"
            )
        return Response(
            {"step": record.latest.step if record.latest else None, "pruned": record.pruned}
        )


class CheckpointCredentialsView(APIView):
    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(
        responses={
            200: inline_serializer(
                "CheckpointCredentials",
                {
                    "AccessKeyId": StrictCharField(),
                    "SecretAccessKey": StrictCharField(),
                    "Token": StrictCharField(),
                    "Expiration": StrictCharField(help_text="ISO 8601, UTC"),
                },
            ),
            401: ErrorSerializer,
            404: ErrorSerializer,
            409: ErrorSerializer,
            503: ErrorSerializer,
        },
        auth=[],
    )
    def get(self, request, pk: int):
        """The job's temporary checkpoint store credentials, limited to its own prefix,
        renewed before they expire: the container-credentials answer AWS SDKs fetch from
        AWS_CONTAINER_CREDENTIALS_FULL_URI with AWS_CONTAINER_AUTHORIZATION_TOKEN, so a
        job running longer than one set of credentials lasts keeps reaching its prefix.
        Only while the job is not finished."""
        token = _job_token(request)
        if not token:
            return error_response(401, _NO_TOKEN, "not_authenticated")
        try:
            credentials = services.job_checkpoint_credentials(token=token, job_id=int(pk))
        except ServiceError:
            raise
        except Exception:  # STS unreachable or refusing: the SDK retries before expiry
            log.exception("job %s: no temporary checkpoint store credentials", pk)
            return error_response(
                503,
                "The checkpoint store's credentials service could not be reached.",
                "unavailable",
            )
        return Response(credentials)
