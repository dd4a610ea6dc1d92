"""The admission webhook: the reviews and their server (webhook.py), its bounded TLS listener (serving.py), the
process that reviews large bodies (reviewing.py), its TLS kept current (tls.py) and its own CA (certs.py).

Nothing is imported here: the reviewing process starts with this package and loads only what it reads.
"""
