"""The view's assets ship in the package and nothing comes from elsewhere: every file of
tracedb/web/static is package data, every asset a page names is one of them, and no page or
asset loads anything from another host (no CDN)."""

from __future__ import annotations

import fnmatch
import os
import re
import tomllib

from tracedb.web.app import STATIC_DIR

from .conftest import REPO, owner_get


def test_every_static_file_is_package_data():
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        globs = tomllib.load(f)["tool"]["setuptools"]["package-data"]["tracedb.web"]
    files = sorted(os.listdir(STATIC_DIR))
    assert files == ["app.css", "app.js"]
    for name in files:
        assert any(fnmatch.fnmatch(f"static/{name}", g) for g in globs), name


def test_pages_name_only_assets_that_ship_and_no_other_host(ui):
    url, ids = ui
    shipped = set(os.listdir(STATIC_DIR))
    for path in ("", f"e/{ids['ok']}", f"diff?a={ids['ok']}&b={ids['other']}", "nowhere"):
        page = owner_get(url + path).text
        named = set(re.findall(r'(?:href|src)="/static/([^"]+)"', page))
        assert named == {"app.css", "app.js"} and named <= shipped, path
        assert not re.search(r'(?:href|src)="(?:https?:)?//', page), path
    for name in shipped:
        r = owner_get(url + "static/" + name)
        assert r.status_code == 200 and "http://" not in r.text and "https://" not in r.text
