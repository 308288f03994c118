"""``gpugate audit``: what runs, judged against today's policies, as PolicyReports and a table."""
