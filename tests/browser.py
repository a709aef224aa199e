"""Headless Chromium for the page tests: load a file, let its scripts run, and read back the
self-check verdict each simsp page writes into <pre id="page-check"> (pictures rendered, script
errors, and the page's own checks), the console errors Chromium logs, and a screenshot."""

import json
import os
import re
import shutil
import subprocess

import pytest

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", "--hide-scrollbars", "--virtual-time-budget=5000"]


def chromium() -> str:
    """The Chromium binary; skip when absent, except in CI (CI must have it: fail there)."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("CI"):
        pytest.fail("CI is set but chromium is not installed (.ci/run installs it)")
    pytest.skip("chromium is not installed")


def _run(args: list[str], tmp_path) -> subprocess.CompletedProcess:
    """Chromium with its own profile folder under the test's temp dir."""
    profile = tmp_path / "chromium-profile"
    return subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=120)


def page_verdict(path, tmp_path) -> tuple[dict, list[str]]:
    """(the page's JSON self-check, console error lines) after loading `path`."""
    done = _run(["--enable-logging=stderr", "--v=0", "--dump-dom", path.resolve().as_uri()],
                tmp_path)
    found = re.search(r'<pre id="page-check">([^<]*)</pre>', done.stdout)
    assert found, f"no self-check in the dumped DOM: {done.stderr[-2000:]}"
    # Chromium logs every console message (errors, uncaught exceptions) as "...:CONSOLE:..."
    # at INFO level; simsp's pages log nothing, so any such line is a failure.
    errors = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&")), errors


def screenshot(path, out_png, tmp_path, size: str = "1400,2400") -> bytes:
    """A PNG screenshot of the page (kept under the test's temp dir)."""
    _run([f"--screenshot={out_png}", f"--window-size={size}", path.resolve().as_uri()], tmp_path)
    return out_png.read_bytes()
