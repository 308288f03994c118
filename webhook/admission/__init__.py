"""The admission webhook: AdmissionReview codec, the mutation and validation core, the server."""
