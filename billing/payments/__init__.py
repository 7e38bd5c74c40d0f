"""Stripe (optional): invoices pushed to Stripe, its webhooks, and prepaid credit bought
through Stripe Checkout. Named `payments`, not `stripe`, so that `import stripe` is always
the library. Without `STRIPE_API_KEY` nothing here calls Stripe and invoices stay local."""
