"""The admission server: the HTTP edge around the pure core in ``webhook.admission``."""
