"""The worker: fetch a URL politely (shared per-domain rate limit, optional response cache),
parse the page, and report the outcome."""
