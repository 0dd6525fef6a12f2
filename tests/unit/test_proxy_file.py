"""PROXY_FILE beside PROXIES: one proxy a line, SOCKS5 among the schemes, credentials never shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.errors import ConfigError
from shared.http.proxies import proxies_of
from shared.settings import Settings


def settings_with(tmp_path: Path, lines: str, proxies: str = "") -> Settings:
    path = tmp_path / "proxies.txt"
    path.write_text(lines, encoding="utf-8")
    return Settings(proxies=proxies, proxy_file=str(path))


def test_the_file_adds_one_proxy_a_line_after_proxies(tmp_path: Path) -> None:
    settings = settings_with(
        tmp_path,
        "# the pool\nsocks5h://u:s3cret@127.0.0.1:1080\n\n  socks5://127.0.0.2:1081  \nhttps://[::1]:8443\n",
        proxies="http://127.0.0.3:3128",
    )
    labels = [proxy.label for proxy in proxies_of(settings)]
    assert labels == [
        "http://127.0.0.3:3128",
        "socks5h://127.0.0.1:1080",
        "socks5://127.0.0.2:1081",
        "https://[::1]:8443",
    ]
    assert proxies_of(settings)[1].url == "socks5h://u:s3cret@127.0.0.1:1080"
    assert "s3cret" not in repr(proxies_of(settings))


def test_a_bad_line_is_named_by_file_and_line_without_its_password(tmp_path: Path) -> None:
    settings = settings_with(tmp_path, "socks5h://127.0.0.1:1080\nsocks4://u:s3cret@127.0.0.1:1080\n")
    with pytest.raises(ConfigError) as caught:
        proxies_of(settings)
    assert f"PROXY_FILE {tmp_path / 'proxies.txt'}:2: expected" in str(caught.value)
    assert "s3cret" not in str(caught.value)


def test_a_proxy_in_both_places_is_refused(tmp_path: Path) -> None:
    settings = settings_with(tmp_path, "http://a:b@127.0.0.1:3128\n", proxies="http://127.0.0.1:3128")
    with pytest.raises(ConfigError, match=r"http://127\.0\.0\.1:3128 is listed twice"):
        proxies_of(settings)


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^PROXY_FILE: cannot read .*\(No such file or directory\)$"):
        proxies_of(Settings(proxy_file=str(tmp_path / "none.txt")))
