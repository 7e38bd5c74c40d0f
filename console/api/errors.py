"""JSON errors for the API: every refusal has a body that says why."""

from __future__ import annotations

from django.http import JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from console.services import ServiceError

SERVICE_ERROR_STATUS = {
    "invalid": status.HTTP_400_BAD_REQUEST,
    "forbidden": status.HTTP_403_FORBIDDEN,
    "not_found": status.HTTP_404_NOT_FOUND,
    "conflict": status.HTTP_409_CONFLICT,
    "payment_required": status.HTTP_402_PAYMENT_REQUIRED,
}


def exception_handler(exc, context):
    if isinstance(exc, ServiceError):
        body = {"detail": exc.message, "code": exc.code}
        if exc.field:
            body[exc.field] = [exc.message]
        return Response(body, status=SERVICE_ERROR_STATUS.get(exc.code, 400))
    response = drf_exception_handler(exc, context)
    if (
        response is not None
        and isinstance(exc, exceptions.APIException)
        and isinstance(response.data, list)
    ):
        response.data = {"detail": response.data}
    return response


def json_error(status_code: int, detail: str) -> JsonResponse:
    return JsonResponse({"detail": detail}, status=status_code)
