"""Pieces every dayzero gRPC service shares: the HTTP health/metrics server, gRPC helpers,
Prometheus metric names, logging and signal handling. Imports no service package."""
