"""The admission core: the AdmissionReview codec, mutation and validation, pure (the server is ``webhook.server``)."""
