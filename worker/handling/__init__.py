"""The parts of the handler (worker/handler.py): where a URL goes next, whether it is still to be
fetched, holding it for its domain's slot, the rows it leaves, the marks and the redelivery
bound.
"""
