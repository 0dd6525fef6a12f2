"""Parsing a page: decoding, the fields we store, the parse budget, extraction profiles."""
