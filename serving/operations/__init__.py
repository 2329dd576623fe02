"""What every port shares: TLS/token security, Prometheus metrics, logging and the request log."""
