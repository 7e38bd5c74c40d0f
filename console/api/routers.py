from rest_framework.routers import SimpleRouter


class OptionalSlashRouter(SimpleRouter):
    """Routes that answer with and without a trailing slash (`/api/v1/jobs` and `/jobs/`),
    so a POST to either never meets a redirect."""

    def __init__(self) -> None:
        super().__init__()
        self.trailing_slash = "/?"
