"""A page's row as the writer sends it to PostgreSQL: no NUL character in any text, its links and
extracted fields as JSONB, every other value as it is."""

from __future__ import annotations

from typing import Any

from worker.store.rows import PAGE_COLUMNS, STORE_PAGES, PageRow, clean, page_params


def row(**fields: Any) -> PageRow:
    base: dict[str, Any] = dict(
        run_id="r",
        url="https://example.com/\x00a",
        final_url="https://example.com/a",
        http_status=200,
        content_type="text/html",
        title="ti\x00tle",
        meta_description=None,
        canonical_url=None,
        lang="en",
        h1=None,
        body_text="text\x00\x00 here",
        links=["https://example.com/b\x00", "https://example.com/c"],
        queue="bulk",
        failed_attempts=1,
        from_cache=False,
        fetch_ms=12,
        worker_id="w",
        extracted={"price": ["1\x00", 2, {"k": "v\x00"}]},
    )
    return PageRow(**{**base, **fields})


def test_page_params_strip_nul_from_every_text_and_keep_the_rest() -> None:
    page = row()
    params = page_params(page)
    assert set(params) == set(page.__dict__)
    assert params["url"] == "https://example.com/a" and params["title"] == "title"
    assert params["body_text"] == "text here"
    assert params["links"].obj == ["https://example.com/b", "https://example.com/c"]
    assert params["extracted"].obj == {"price": ["1", 2, {"k": "v"}]}
    plain = {k: v for k, v in params.items() if k not in ("links", "extracted")}
    assert plain == {k: clean(v) for k, v in page.__dict__.items() if k not in ("links", "extracted")}
    assert params["http_status"] == 200 and params["from_cache"] is False and params["fetch_ms"] == 12
    assert params["meta_description"] is None and params["warc_offset"] is None


def test_a_batch_is_one_execution_of_arrays_and_a_url_twice_goes_to_a_second() -> None:
    first, second = page_params(row(url="https://a/1")), page_params(row(url="https://a/2"))
    again = page_params(row(url="https://a/1", failed_attempts=3))
    executions = STORE_PAGES.executions([first, second, again])
    assert [sql for sql, _ in executions] == [STORE_PAGES.sql, STORE_PAGES.one_row_sql]
    arrays = executions[0][1]
    assert set(arrays) == set(PAGE_COLUMNS) == set(first)  # every column of a row, and no other
    assert arrays["url"] == ["https://a/1", "https://a/2"] and arrays["failed_attempts"] == [1, 1]
    assert executions[1][1] is again  # a lone row goes as it is


def test_a_lone_row_is_the_one_row_statement() -> None:
    lone = page_params(row())
    assert STORE_PAGES.executions([lone]) == [(STORE_PAGES.one_row_sql, lone)]
