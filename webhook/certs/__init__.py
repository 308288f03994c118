"""The webhook's TLS material: a private CA and serving certificate, and publishing them to the cluster."""
