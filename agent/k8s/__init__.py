"""Kubernetes API access: configuration, one HTTP client, retries. No other module talks HTTP."""
