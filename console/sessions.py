"""Sessions in the database, as Django keeps them, read with a query compiled once per
process (console.compiled): every signed-in page loads its session, and compiling the
ORM's lookup took longer than running it."""

from __future__ import annotations

from django.contrib.sessions.backends.db import SessionStore as DatabaseSessionStore
from django.utils import timezone

from console.compiled import compiled_first


class SessionStore(DatabaseSessionStore):
    def _get_session_from_db(self):
        if self.session_key is None:
            return None
        found = compiled_first(
            "session",
            self.model,
            lambda at: self.model.objects.filter(
                session_key=at.text("session_key"), expire_date__gt=at.datetime("now")
            ),
            session_key=self.session_key,
            now=timezone.now(),
        )
        if found is None:  # gone or expired: a new session, as Django's store does
            self._session_key = None
        return found
