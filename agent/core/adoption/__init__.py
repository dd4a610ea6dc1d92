"""Adoption: what inject and the webhook add to a job's pod templates, and what the webhook admits."""
