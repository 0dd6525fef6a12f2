"""Decoding a body whose raw bytes are kept for its WARC record.

With WARC on, the fetcher reads the body as it came (urllib3's `decode_content=False`) and
decodes it here, chunk by chunk, for the parser and the size cap: one read gives both, with no
second copy of the decoded bytes. The codings are the ones the fetcher asks for (requests'
Accept-Encoding: gzip, deflate); any other is left as it came, as urllib3 leaves a coding it
cannot decode.
"""

from __future__ import annotations

import zlib

from shared.errors import PermanentError

_GZIP_WBITS = 16 + zlib.MAX_WBITS


class _Deflate:
    """`deflate` as servers send it: zlib-wrapped, as the standard says, or raw, as some do."""

    def __init__(self) -> None:
        self._inflater = zlib.decompressobj()
        self._first = True

    def decompress(self, data: bytes, limit: int) -> bytes:
        if self._first and data:
            self._first = False
            try:
                return self._inflater.decompress(data, limit)
            except zlib.error:
                self._inflater = zlib.decompressobj(-zlib.MAX_WBITS)
        return self._inflater.decompress(data, limit)


class _Gzip:
    """gzip, members one after another included, as urllib3 decodes it."""

    def __init__(self) -> None:
        self._inflater = zlib.decompressobj(_GZIP_WBITS)

    def decompress(self, data: bytes, limit: int) -> bytes:
        out = self._inflater.decompress(data, limit)
        while self._inflater.eof and self._inflater.unused_data and len(out) < limit:
            rest = self._inflater.unused_data
            self._inflater = zlib.decompressobj(_GZIP_WBITS)
            out += self._inflater.decompress(rest, limit - len(out))
        return out


class BodyDecoder:
    """Decodes a body by its Content-Encoding header, the codings applied last undone first."""

    def __init__(self, content_encoding: str | None, url: str) -> None:
        self._url = url
        self._steps: list[_Deflate | _Gzip] = []
        codings = [c.strip().lower() for c in (content_encoding or "").split(",") if c.strip()]
        for coding in reversed(codings):
            if coding in ("gzip", "x-gzip"):
                self._steps.append(_Gzip())
            elif coding == "deflate":
                self._steps.append(_Deflate())
            elif coding != "identity":
                self._steps = []  # one coding we cannot undo: the body stays as it came
                break

    @property
    def decodes(self) -> bool:
        """False when the body is kept as it came: the raw bytes are the decoded ones."""
        return bool(self._steps)

    def decode(self, data: bytes, limit: int) -> bytes:
        """`data` decoded, cut at `limit` + 1 bytes: whoever sees more than `limit` refuses the
        body, so a small bomb of a body never inflates in memory past the cap."""
        try:
            for step in self._steps:
                data = step.decompress(data, limit + 1)
        except zlib.error as exc:
            raise PermanentError("bad_content_encoding", f"{self._url}: {exc}") from None
        return data
