"""A local Stripe-like HTTP API for tests: the real `stripe` library talks to it (its
`api_base` pointed here) with form-encoded requests and gets Stripe-shaped JSON back.

Endpoints: POST /v1/customers, /v1/invoiceitems, /v1/invoices,
/v1/invoices/{id}/finalize, /void, /mark_uncollectible, /pay (out of band only),
/v1/checkout/sessions, /v1/credit_notes; GET /v1/invoices/{id}, /v1/checkout/sessions/{id}.

Fidelity to Stripe (what the code under test relies on):
- Idempotency (docs.stripe.com/api/idempotent_requests): the first response to a key is
  stored and replayed for every later request with that key (`Idempotent-Replayed:
  true`); the same key with other parameters or another endpoint is a 400
  `idempotency_error`. A POST without a key is executed every time. Requests execute
  one at a time (so Stripe's 409 for a key still in progress never arises here).
- Faults: `timeout_next(n)` executes the request (the object is made and its response
  stored under the key), then sleeps longer than the client waits before answering, as
  when the network drops a response; `fail_next(n)` answers 500 before executing
  anything, as an outage in front of the API does (Stripe stores nothing for the key
  then, so a retry executes it). Every request is recorded in `requests`.
- Money is integer minor units; an invoice's total is the sum of its items, computed
  when it is finalized; finalizing twice is a 400, items can't be added to a finalized
  invoice.
- Credit notes (docs.stripe.com/api/credit_notes/create): only on an open, paid or
  uncollectible invoice. On an unpaid one it lowers `amount_due`/`amount_remaining`
  (at most what remains; the invoice becomes paid at 0) and takes no refund, credit or
  out-of-band amount; on a paid one those three must sum to the note's amount.

Not modelled: expansion, lists and search, real payments (tests move objects with
`pay_invoice`, `void_invoice`, … and build the matching events with `event`), keys
expiring after 24 hours.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import itertools
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

API_VERSION = "2026-10-28.endive"


def sign(payload: str, secret: str, timestamp: int | None = None) -> str:
    """A `Stripe-Signature` header for `payload`, computed as Stripe does:
    t=<unix time>,v1=HMAC-SHA256(secret, "<t>.<payload>")."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    mac = hmac.new(secret.encode(), f"{timestamp}.{payload}".encode(), hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def decode_form(body: str) -> dict[str, Any]:
    """Stripe's form encoding back into nested values: `metadata[a]=1` is a dict,
    `line_items[0][quantity]=1` a list of dicts."""
    root: dict[str, Any] = {}
    for name, value in parse_qsl(body, keep_blank_values=True):
        head, *rest = re.findall(r"[^\[\]]+", name)
        node: Any = root
        keys = [head, *rest]
        for key, following in itertools.zip_longest(keys, keys[1:]):
            if following is None:
                node[key] = value
                break
            node = node.setdefault(key, {})
    return _lists(root)


def _lists(value: Any) -> Any:
    if isinstance(value, dict):
        converted = {key: _lists(item) for key, item in value.items()}
        if converted and all(key.isdigit() for key in converted):
            return [converted[key] for key in sorted(converted, key=int)]
        return converted
    return value


class StripeFault(Exception):
    def __init__(self, status: int, error_type: str, message: str, code: str = "") -> None:
        super().__init__(message)
        self.status, self.error_type, self.message, self.code = status, error_type, message, code

    def body(self) -> dict[str, Any]:
        error = {"type": self.error_type, "message": self.message}
        if self.code:
            error["code"] = self.code
        return {"error": error}


@dataclass
class Recorded:
    method: str
    path: str
    params: dict[str, Any]
    idempotency_key: str | None
    outcome: str = ""  # executed | replayed | failed | delayed | refused


@dataclass
class _Stored:
    method: str
    path: str
    params: dict[str, Any]
    status: int = 0
    body: dict[str, Any] = field(default_factory=dict)


class FakeStripe:
    """Start with `start()`, point `api_base` at `url`, stop with `stop()`."""

    def __init__(self, *, api_key: str = "sk_test_gpugeek") -> None:
        self.api_key = api_key
        self.requests: list[Recorded] = []
        self.customers: dict[str, dict] = {}
        self.invoices: dict[str, dict] = {}
        self.invoice_items: dict[str, dict] = {}
        self.sessions: dict[str, dict] = {}
        self.credit_notes: dict[str, dict] = {}
        self._stored: dict[str, _Stored] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._timeouts: list[str] = []  # path prefixes of the requests to time out
        self._timeout_seconds = 3.0
        self._held: list[str] = []  # path prefixes of the requests answered together
        self._hold: threading.Barrier | None = None
        self._failures: list[str] = []
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ---

    def start(self) -> FakeStripe:
        handler = type("Handler", (_Handler,), {"fake": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        assert self._server is not None, "start() it first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # --- faults ---

    def timeout_next(self, count: int = 1, *, path: str = "/", seconds: float = 3.0) -> None:
        """The next `count` requests to paths starting with `path` are executed, then
        answered after `seconds` (by default longer than the tests' client waits; a
        shorter delay just makes the answer slow)."""
        with self._lock:
            self._timeouts += [path] * count
            self._timeout_seconds = seconds

    def answer_together(self, count: int, *, path: str = "/", within: float = 20.0) -> None:
        """The next `count` requests to paths starting with `path` are executed, then
        answered only once all `count` have arrived (or `within` seconds have passed):
        a race every caller is in, however slowly the machine starts them."""
        with self._lock:
            self._held += [path] * count
            self._hold = threading.Barrier(count, timeout=within)

    def fail_next(self, count: int = 1, *, path: str = "/") -> None:
        """The next `count` requests to paths starting with `path` get a 500 without
        being executed."""
        with self._lock:
            self._failures += [path] * count

    # --- what tests look at ---

    def posts(self, path_prefix: str) -> list[Recorded]:
        return [r for r in self.requests if r.method == "POST" and r.path.startswith(path_prefix)]

    def keys(self, path_prefix: str) -> list[str | None]:
        return [r.idempotency_key for r in self.posts(path_prefix)]

    # --- moving objects as a payment would, and the events that say so ---

    def pay_invoice(self, invoice_id: str) -> dict:
        return self._invoice_status(invoice_id, "paid", paid=True)

    def fail_invoice_payment(self, invoice_id: str) -> dict:
        with self._lock:
            invoice = self.invoices[invoice_id]
            invoice["attempt_count"] = invoice.get("attempt_count", 0) + 1
            return copy.deepcopy(invoice)

    def void_invoice(self, invoice_id: str) -> dict:
        return self._invoice_status(invoice_id, "void")

    def mark_uncollectible(self, invoice_id: str) -> dict:
        return self._invoice_status(invoice_id, "uncollectible")

    def _invoice_status(self, invoice_id: str, status: str, paid: bool = False) -> dict:
        with self._lock:
            invoice = self.invoices[invoice_id]
            invoice["status"] = status
            if paid:
                invoice["paid"] = True
                invoice["amount_paid"] = invoice["amount_due"]
                invoice["amount_remaining"] = 0
            return copy.deepcopy(invoice)

    def complete_session(self, session_id: str) -> dict:
        with self._lock:
            session = self.sessions[session_id]
            session.update(status="complete", payment_status="paid")
            return copy.deepcopy(session)

    def event(self, event_type: str, obj: dict, *, event_id: str | None = None) -> dict:
        """A webhook event envelope carrying a copy of `obj`."""
        return {
            "id": event_id or self._id("evt"),
            "object": "event",
            "api_version": API_VERSION,
            "created": int(time.time()),
            "livemode": False,
            "pending_webhooks": 1,
            "type": event_type,
            "data": {"object": copy.deepcopy(obj)},
        }

    # --- the API ---

    def _id(self, prefix: str) -> str:
        return f"{prefix}_test{next(self._ids):06d}"

    def handle(self, method: str, path: str, params: dict, key: str | None) -> tuple[int, dict]:
        """Answer one request; returns (status, body) and records it. May sleep (timeout)."""
        record = Recorded(method, path, params, key)
        with self._lock:
            self.requests.append(record)
            if self._take(self._failures, path):
                record.outcome = "failed"
                return 500, StripeFault(500, "api_error", "Stripe is having trouble.").body()
            timeout = self._timeout_seconds if self._take(self._timeouts, path) else 0.0
            hold = self._hold if self._take(self._held, path) else None
            stored = self._stored.get(key) if key and method == "POST" else None
            if stored is not None:
                if (stored.method, stored.path, stored.params) != (method, path, params):
                    record.outcome = "refused"
                    return 400, StripeFault(
                        400,
                        "idempotency_error",
                        "Keys for idempotent requests can only be used with the same "
                        "parameters they were first used with.",
                    ).body()
                record.outcome = "replayed"
                return stored.status, {**copy.deepcopy(stored.body), "_replayed": True}
            if key and method == "POST":
                stored = self._stored[key] = _Stored(method, path, params)
            try:
                status, body = 200, self._execute(method, path, params)
            except StripeFault as fault:
                status, body = fault.status, fault.body()
            if stored is not None:
                stored.status, stored.body = status, copy.deepcopy(body)
            record.outcome = "executed"
        if timeout:
            record.outcome = "delayed"
            self._stopping.wait(timeout)  # the client has given up by now
        if hold is not None:
            record.outcome = "held"
            try:
                hold.wait()
            except threading.BrokenBarrierError:
                record.outcome = "held alone"  # not all arrived in time: the test sees it
        return status, body

    @staticmethod
    def _take(faults: list[str], path: str) -> bool:
        for index, prefix in enumerate(faults):
            if path.startswith(prefix):
                del faults[index]
                return True
        return False

    def _execute(self, method: str, path: str, params: dict) -> dict:
        routes = [
            ("POST", r"/v1/customers", self._customer_create),
            ("POST", r"/v1/invoices", self._invoice_create),
            ("POST", r"/v1/invoiceitems", self._invoice_item_create),
            ("POST", r"/v1/invoices/(?P<id>[^/]+)/finalize", self._invoice_finalize),
            ("POST", r"/v1/invoices/(?P<id>[^/]+)/void", self._invoice_void),
            ("POST", r"/v1/invoices/(?P<id>[^/]+)/mark_uncollectible", self._invoice_uncollectible),
            ("POST", r"/v1/invoices/(?P<id>[^/]+)/pay", self._invoice_pay),
            ("GET", r"/v1/invoices/(?P<id>[^/]+)", self._invoice_get),
            ("POST", r"/v1/checkout/sessions", self._session_create),
            ("GET", r"/v1/checkout/sessions/(?P<id>[^/]+)", self._session_get),
            ("POST", r"/v1/credit_notes", self._credit_note_create),
        ]
        for route_method, pattern, action in routes:
            match = re.fullmatch(pattern, path)
            if match and route_method == method:
                return action(params, **match.groupdict())
        raise StripeFault(404, "invalid_request_error", f"Unrecognized request URL ({path}).")

    @staticmethod
    def _require(params: dict, *names: str) -> None:
        for name in names:
            if name not in params:
                raise StripeFault(
                    400,
                    "invalid_request_error",
                    f"Missing required param: {name}.",
                    "parameter_missing",
                )

    def _customer_create(self, params: dict) -> dict:
        customer = {
            "id": self._id("cus"),
            "object": "customer",
            "created": int(time.time()),
            "name": params.get("name"),
            "description": params.get("description"),
            "metadata": params.get("metadata", {}),
        }
        self.customers[customer["id"]] = customer
        return copy.deepcopy(customer)

    def _invoice_create(self, params: dict) -> dict:
        self._require(params, "customer")
        if params["customer"] not in self.customers:
            raise StripeFault(400, "invalid_request_error", "No such customer.", "resource_missing")
        invoice = {
            "id": self._id("in"),
            "object": "invoice",
            "customer": params["customer"],
            "currency": params.get("currency", "usd"),
            "collection_method": params.get("collection_method", "charge_automatically"),
            "days_until_due": int(params["days_until_due"]) if "days_until_due" in params else None,
            "auto_advance": params.get("auto_advance") == "true",
            "description": params.get("description"),
            "metadata": params.get("metadata", {}),
            "status": "draft",
            "number": None,
            "hosted_invoice_url": None,
            "attempt_count": 0,
            "paid": False,
            "total": 0,
            "amount_due": 0,
            "amount_paid": 0,
            "amount_remaining": 0,
        }
        self.invoices[invoice["id"]] = invoice
        return copy.deepcopy(invoice)

    def _invoice_item_create(self, params: dict) -> dict:
        self._require(params, "customer", "amount", "currency")
        invoice_id = params.get("invoice")
        if invoice_id is not None:
            invoice = self.invoices.get(invoice_id)
            if invoice is None:
                raise StripeFault(
                    400, "invalid_request_error", "No such invoice.", "resource_missing"
                )
            if invoice["status"] != "draft":
                raise StripeFault(
                    400, "invalid_request_error", "You can only add items to a draft invoice."
                )
        item = {
            "id": self._id("ii"),
            "object": "invoiceitem",
            "customer": params["customer"],
            "invoice": invoice_id,
            "amount": int(params["amount"]),
            "currency": params["currency"],
            "description": params.get("description"),
            "metadata": params.get("metadata", {}),
        }
        self.invoice_items[item["id"]] = item
        return copy.deepcopy(item)

    def _invoice_finalize(self, params: dict, id: str) -> dict:
        invoice = self.invoices.get(id)
        if invoice is None:
            raise StripeFault(
                404, "invalid_request_error", f"No such invoice: '{id}'", "resource_missing"
            )
        if invoice["status"] != "draft":
            raise StripeFault(
                400,
                "invalid_request_error",
                "This invoice is already finalized.",
                "invoice_not_editable",
            )
        total = sum(i["amount"] for i in self.invoice_items.values() if i["invoice"] == id)
        number = sum(1 for i in self.invoices.values() if i["number"]) + 1
        invoice.update(
            status="open",
            number=f"FAKE-{number:04d}",
            total=total,
            amount_due=total,
            amount_remaining=total,
            hosted_invoice_url=f"{self.url}/i/{id}",
            auto_advance=params.get("auto_advance") == "true",
        )
        return copy.deepcopy(invoice)

    def _invoice_move(self, id: str, to: str, allowed_from: tuple[str, ...]) -> dict:
        invoice = self._invoice_get({}, id)
        if invoice["status"] not in allowed_from:
            raise StripeFault(
                400,
                "invalid_request_error",
                f"You can't change a {invoice['status']} invoice to {to}.",
                "invoice_unexpected_state",
            )
        self.invoices[id]["status"] = to
        return copy.deepcopy(self.invoices[id])

    def _invoice_void(self, params: dict, id: str) -> dict:
        return self._invoice_move(id, "void", ("open", "uncollectible"))

    def _invoice_uncollectible(self, params: dict, id: str) -> dict:
        return self._invoice_move(id, "uncollectible", ("open",))

    def _invoice_pay(self, params: dict, id: str) -> dict:
        if params.get("paid_out_of_band") != "true":
            raise StripeFault(402, "card_error", "This fake collects no money.", "card_declined")
        self.invoices[id]["paid_out_of_band"] = True
        return self._invoice_move(id, "paid", ("open", "uncollectible"))

    def _invoice_get(self, params: dict, id: str) -> dict:
        invoice = self.invoices.get(id)
        if invoice is None:
            raise StripeFault(
                404, "invalid_request_error", f"No such invoice: '{id}'", "resource_missing"
            )
        return copy.deepcopy(invoice)

    def _session_create(self, params: dict) -> dict:
        self._require(params, "mode", "line_items", "success_url")
        amount = sum(
            int(item["price_data"]["unit_amount"]) * int(item.get("quantity", 1))
            for item in params["line_items"]
        )
        session = {
            "id": self._id("cs"),
            "object": "checkout.session",
            "mode": params["mode"],
            "customer": params.get("customer"),
            "client_reference_id": params.get("client_reference_id"),
            "metadata": params.get("metadata", {}),
            "currency": params["line_items"][0]["price_data"]["currency"],
            "amount_total": amount,
            "status": "open",
            "payment_status": "unpaid",
            "success_url": params["success_url"],
            "cancel_url": params.get("cancel_url"),
        }
        session["url"] = f"{self.url}/c/pay/{session['id']}"
        self.sessions[session["id"]] = session
        return copy.deepcopy(session)

    def _session_get(self, params: dict, id: str) -> dict:
        session = self.sessions.get(id)
        if session is None:
            raise StripeFault(404, "invalid_request_error", f"No such checkout.session: '{id}'")
        return copy.deepcopy(session)

    def _credit_note_create(self, params: dict) -> dict:
        self._require(params, "invoice", "amount")
        invoice = self._invoice_get({}, params["invoice"])
        if invoice["status"] not in ("open", "paid", "uncollectible"):
            raise StripeFault(
                400,
                "invalid_request_error",
                f"You can't create a credit note on a {invoice['status']} invoice.",
                "invoice_unexpected_state",
            )
        amount = int(params["amount"])
        post_payment = sum(
            int(params.get(name, 0))
            for name in ("refund_amount", "credit_amount", "out_of_band_amount")
        )
        stored = self.invoices[invoice["id"]]
        if invoice["status"] == "paid":
            if post_payment != amount:
                raise StripeFault(
                    400,
                    "invalid_request_error",
                    "The sum of refund, credit and out of band amounts must equal the "
                    "credit note amount for a paid invoice.",
                )
        elif post_payment or not 0 < amount <= invoice["amount_remaining"]:
            raise StripeFault(
                400,
                "invalid_request_error",
                "A credit note on an unpaid invoice lowers what remains to pay: at most "
                f"{invoice['amount_remaining']}, with no refund, credit or out of band amount.",
            )
        else:
            stored["amount_due"] -= amount
            stored["amount_remaining"] -= amount
            if stored["amount_remaining"] == 0:
                stored.update(status="paid", paid=True)
        note = {
            "id": self._id("cn"),
            "object": "credit_note",
            "invoice": invoice["id"],
            "customer": invoice["customer"],
            "amount": amount,
            "out_of_band_amount": int(params.get("out_of_band_amount", 0)) or None,
            "type": "post_payment" if invoice["status"] == "paid" else "pre_payment",
            "memo": params.get("memo"),
            "metadata": params.get("metadata", {}),
            "status": "issued",
        }
        self.credit_notes[note["id"]] = note
        return copy.deepcopy(note)


class _Handler(BaseHTTPRequestHandler):
    fake: FakeStripe
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _serve(self, method: str) -> None:
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        if self.headers.get("Authorization") != f"Bearer {self.fake.api_key}":
            status, payload = (
                401,
                StripeFault(401, "invalid_request_error", "Invalid API Key provided.").body(),
            )
        else:
            params = decode_form(body if method == "POST" else parts.query)
            key = self.headers.get("Idempotency-Key")
            status, payload = self.fake.handle(method, parts.path, params, key)
        replayed = payload.pop("_replayed", False)
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Request-Id", f"req_{id(payload)}")
            if replayed:
                self.send_header("Idempotent-Replayed", "true")
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client timed out and left: the object exists all the same

    def do_POST(self) -> None:
        self._serve("POST")

    def do_GET(self) -> None:
        self._serve("GET")
