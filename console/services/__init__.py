"""Writes for accounts and tenancy, a module for each thing they own: `audit`, `mail`,
`headers` (the client's address), `tenants`, `accounts` (unverified addresses, sign-up
through an invitation), `invitations`, `memberships`, `tokens`, `notifications`. Import
the module you need; this package re-exports nothing."""
