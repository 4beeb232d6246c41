"""Chat channels in front of the runtime (docs/gateway.md#telegram). Each one is a client of
the gateway's backend (nanocrab/gateway/service.py): the same identities, tenant scoping,
signed approvals and live feed as the HTTP API."""
