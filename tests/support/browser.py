"""The headless Chromium that renders report.html in the report tests (Debian's package; .ci/run installs it)."""
from __future__ import annotations

import shutil

import pytest


def chromium() -> str:
    """The browser's path, or a skip naming the package to install."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("headless Chromium is not installed (Debian package `chromium`; .ci/run installs it)")
