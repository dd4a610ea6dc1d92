"""SSH key material: the job Secret (keygen) and each pod host key and certificate. asyncssh does the crypto."""
