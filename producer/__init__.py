"""The producer: turns sitemaps, sites and URL files into crawl tasks on the work queues.

Entry point: ``python -m producer`` (producer.__main__); one run is producer.service.run.
"""
