"""The report and the served page in a real headless browser (Debian's chromium + chromedriver, selenium).

No console errors, every plot drawn (an SVG with marks in it), a form change updates the numbers, a bad
value shows the server's one-line error.  Screenshots go to ``$TRAINPLAN_TEST_ARTEFACTS`` (default: the
test's tmp dir); with ``TRAINPLAN_UPDATE_DOC_IMAGES=1`` the page's is also copied to docs/img/ for the README.

Without chromium these tests skip on a developer's machine and FAIL in CI (``CI`` set), which installs it.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def _need(what: str) -> None:
    msg = f"{what} — install Debian's chromium and chromium-driver (apt-get install -y chromium chromium-driver) and pip install selenium"
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the browser tests: {msg}")
    pytest.skip(msg)


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _need("selenium is not installed")
    binary = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    chromedriver = shutil.which("chromedriver")
    if binary is None or chromedriver is None:
        _need("chromium or chromedriver not found on PATH")
    opts = Options()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1300,1000"):
        opts.add_argument(arg)
    opts.binary_location = binary
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(chromedriver), options=opts)
    d.set_page_load_timeout(60)
    try:
        yield d
    finally:
        d.quit()


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    env = os.environ.get("TRAINPLAN_TEST_ARTEFACTS")
    path = Path(env) if env else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def errors(d: Any) -> list[dict[str, Any]]:
    return [e for e in d.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def wait(d: Any, cond: Any, timeout: float = 45) -> Any:
    """Wait for ``cond``; on a time-out, fail with what the page and its console say (not a bare TimeoutException)."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(d, timeout, poll_frequency=0.1).until(cond)
    except TimeoutException:
        shown = d.execute_script("const e = document.getElementById('error'); return e ? e.textContent : null;")
        pytest.fail(f"timed out after {timeout} s on {d.current_url}; plots {drawn_plots(d)}; error box {shown!r}; console {d.get_log('browser')}")


def drawn_plots(d: Any) -> dict[str, int]:
    """Marks (bars, points, lines) drawn in each plotly plot's SVG, by div id."""
    return d.execute_script("""
      const out = {};
      for (const div of document.querySelectorAll('.js-plotly-plot')) {
        const svg = div.querySelector('svg.main-svg');
        out[div.id] = svg ? svg.querySelectorAll('.trace path, .trace .point, .scatterlayer path, .barlayer path').length : 0;
      }
      return out;""")


def save(d: Any, artefacts: Path, name: str, *, doc: bool = False) -> Path:
    path = artefacts / name
    d.save_screenshot(str(path))
    assert path.stat().st_size > 10_000  # a real picture, not a blank page
    if doc and os.environ.get("TRAINPLAN_UPDATE_DOC_IMAGES") == "1":
        (ROOT / "docs" / "img").mkdir(parents=True, exist_ok=True)
        shutil.copy(path, ROOT / "docs" / "img" / name)
    return path


def test_report_opens_offline_with_every_plot(driver: Any, artefacts: Path, job_file: Path, run_dir: Path, tmp_path: Path) -> None:
    from trainplan.report.html import write_report

    for name, source, expected in (("report-plan.png", job_file, {"memory", "tradeoff"}),
                                   ("report-run.png", run_dir, {"run-loss", "run-throughput", "run-steptime", "run-memory"})):  # fmt: skip
        out = write_report(source, tmp_path / (name + ".html"))
        driver.get(out.as_uri())
        wait(driver, lambda d: set(drawn_plots(d)) >= expected and all(drawn_plots(d).values()))
        plots = drawn_plots(driver)
        assert set(plots) == expected | ({"memory", "tradeoff"} if source == run_dir else set()), plots
        assert all(n > 0 for n in plots.values()), plots
        assert errors(driver) == []
        for plot in ("memory", "tradeoff") if source == job_file else ("run-loss",):
            driver.execute_script(f"document.getElementById('{plot}').scrollIntoView()")
            save(driver, artefacts, name.replace(".png", f"-{plot}.png"), doc=source == job_file)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server() -> Iterator[str]:
    """uvicorn on 127.0.0.1 and a free port in a thread, stopped at the end of the test."""
    import uvicorn

    from trainplan.serve.app import create_app

    port = _free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="warning", ws="none"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(timeout=10)
        assert not thread.is_alive()


def test_served_page_updates_and_shows_errors(driver: Any, artefacts: Path, server: str) -> None:
    from selenium.webdriver.common.by import By

    def updates(d: Any) -> int:
        return int(d.find_element(By.TAG_NAME, "body").get_attribute("data-updates"))

    def text(element_id: str) -> str:
        return str(driver.find_element(By.ID, element_id).text)

    driver.get(server + "/")
    wait(driver, lambda d: updates(d) >= 1 and drawn_plots(d).get("memchart", 0) > 0)
    first_peak, first_activations = text("d-peak"), text("m-activations_gib")
    assert "GiB" in first_peak and float(first_activations) > 0
    assert len(driver.find_elements(By.CSS_SELECTOR, "#options-body tr")) == 15
    save(driver, artefacts, "serve-page.png", doc=True)

    box = driver.find_element(By.ID, "f-micro_batch")
    box.clear()
    box.send_keys("1")
    wait(driver, lambda d: updates(d) >= 2 and text("m-activations_gib") != first_activations)
    assert float(text("m-activations_gib")) < float(first_activations)
    assert errors(driver) == []  # nothing went wrong up to here

    box.clear()
    box.send_keys("-2")
    wait(driver, lambda d: d.find_element(By.ID, "error").is_displayed())
    assert text("error") == "micro_batch: must be > 0, got -2"
    logged = errors(driver)
    assert logged and all(e["source"] == "network" and "/api/estimate" in e["message"] and "422" in e["message"] for e in logged)
    save(driver, artefacts, "serve-error.png")

    box.clear()
    box.send_keys("2")  # the server kept serving: a good value clears the error
    wait(driver, lambda d: not d.find_element(By.ID, "error").is_displayed())
    assert float(text("m-activations_gib")) > 0 and errors(driver) == []
