"""Credit notes and the tenant credit balance they feed. Rooms: services (credit notes),
ledger (the one way a credit balance moves).
"""
