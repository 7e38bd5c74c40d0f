"""An invoice as a PDF file: what the printable view shows (the header, the lines, the
totals down to the amount due, the credit notes), drawn with fpdf2 (pure Python, no
system libraries).

It uses the PDF core fonts, which cover Latin-1 only: typographic punctuation is mapped
to its ASCII look-alike and any other character outside Latin-1 becomes "?" (the
printable HTML view shows every script)."""

from __future__ import annotations

from decimal import Decimal

from fpdf import FPDF
from fpdf.fonts import FontFace

from billing.models import Invoice
from console.templatetags.money import UNIT_PRICE_PLACES, format_money

FONT = "Helvetica"
LOOK_ALIKES = str.maketrans(
    {"–": "-", "—": "-", "−": "-", "‘": "'", "’": "'", "“": '"', "”": '"', "…": "..."}
)
BOLD = FontFace(emphasis="BOLD")


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, Decimal):
        return f"{value:f}"  # "0.000000000", as the page shows it, not "0E-9"
    return str(value).translate(LOOK_ALIKES).encode("latin-1", "replace").decode("latin-1")


def _percent(rate: Decimal) -> str:
    return f"{rate.normalize():f}"


def _totals(invoice: Invoice) -> list[tuple[str, str]]:
    """The rows under the lines, as the printable view's table foot has them, in the
    console's one money format."""

    def money(amount: Decimal) -> str:
        return _text(format_money(amount, invoice.currency))

    rows = [("Subtotal", money(invoice.subtotal))]
    if invoice.discount:
        rows.append(
            ("Negotiated discount (included in the prices above)", f"-{money(invoice.discount)}")
        )
    rows += [
        (f"{invoice.tax_label} ({_percent(invoice.tax_rate_percent)} %)", money(invoice.tax)),
        ("Rounding", money(invoice.rounding)),
        ("Total", money(invoice.total)),
    ]
    if invoice.credits_applied:
        rows.append(("Credits applied", f"-{money(invoice.credits_applied)}"))
    if invoice.amount_credited:
        rows.append(("Credit notes", f"-{money(invoice.amount_credited)}"))
    rows.append(("Amount due", money(invoice.amount_due)))
    return rows


def invoice_pdf(*, invoice: Invoice) -> bytes:
    number = invoice.number or "(draft)"
    pdf = FPDF(format="A4")
    pdf.set_title(_text(f"Invoice {number}"))
    pdf.set_creator("GpuGeek")
    pdf.add_page()
    pdf.set_font(FONT, style="B", size=16)
    pdf.cell(text=_text(f"GpuGeek - Invoice {number}"), new_x="LMARGIN", new_y="NEXT")
    pdf.set_font(FONT, size=10)
    status = f"Status: {invoice.get_status_display()}"
    if invoice.finalized_at:
        status += f" - issued {invoice.finalized_at:%Y-%m-%d}"
    if invoice.due_at:
        status += f" - due {invoice.due_at:%Y-%m-%d}"
    period = f"Period {invoice.period_start:%Y-%m-%d} - {invoice.period_end:%Y-%m-%d}"
    for text in (invoice.tenant.name, period, status):
        pdf.multi_cell(0, 6, _text(text), new_x="LMARGIN", new_y="NEXT")
    pdf.ln(4)

    with pdf.table(
        col_widths=(70, 25, 20, 30, 35),
        text_align=("LEFT", "RIGHT", "LEFT", "RIGHT", "RIGHT"),
        headings_style=BOLD,
    ) as table:
        table.row(["Description", "Quantity", "Unit", "Unit price", "Amount"])
        lines = list(invoice.lines.all())
        for line in lines:
            description = line.description + (f"\n{line.reason}" if line.reason else "")
            unit_price = (
                ""
                if line.unit_price is None
                else format_money(line.unit_price, invoice.currency, UNIT_PRICE_PLACES)
            )
            table.row(
                [_text(description), _text(line.quantity), _text(line.unit),
                 unit_price, format_money(line.amount, invoice.currency)]
            )  # fmt: skip
        if not lines:
            table.row(["No usage in this period.", "", "", "", ""])
    with pdf.table(
        col_widths=(145, 35), text_align=("LEFT", "RIGHT"), first_row_as_headings=False
    ) as table:
        for label, amount in _totals(invoice):
            table.row([_text(label), _text(amount)])

    notes = list(invoice.credit_notes.all())
    if notes:
        pdf.ln(4)
        pdf.set_font(FONT, style="B", size=12)
        pdf.cell(text="Credit notes", new_x="LMARGIN", new_y="NEXT")
        pdf.set_font(FONT, size=10)
        with pdf.table(
            col_widths=(40, 85, 25, 30),
            text_align=("LEFT", "LEFT", "LEFT", "RIGHT"),
            headings_style=BOLD,
        ) as table:
            table.row(["Number", "Reason", "Date", "Total"])
            for note in notes:
                table.row(
                    [_text(note.number), _text(note.reason), f"{note.created_at:%Y-%m-%d}",
                     format_money(note.total, invoice.currency)]
                )  # fmt: skip
    return bytes(pdf.output())
