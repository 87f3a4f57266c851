"""The charts of `casedb serve`, drawn by headless Chromium (Debian's chromium + chromium-driver).

The screenshot of the pass-rate dashboard is written to artifacts/pass-rate-chart.png (CI keeps it).
"""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests import runs_data

CHROMIUM = os.environ.get("CASEDB_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CASEDB_CHROMEDRIVER") or shutil.which("chromedriver") or "/usr/bin/chromedriver"
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"

if not Path(CHROMIUM).exists() or not Path(CHROMEDRIVER).exists():
    pytest.skip(f"needs Debian's chromium ({CHROMIUM}) and chromium-driver ({CHROMEDRIVER}): "
                "apt-get install -y chromium chromium-driver (.ci/run does)", allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (pip install -e '.[dev]')")
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("browser")
    db = tmp / "cases.db"
    runs_data.two_runs(runs_data.make_cli(db), tmp, db)
    with runs_data.Server(db, tmp / "serve.log") as server:
        yield server


@pytest.fixture(scope="module")
def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="casedb-chromium-")
    # The background-networking flags keep Chromium from calling home: on a closed network those
    # connections are refused and stall it.
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--user-data-dir={profile}", "--window-size=1280,1300"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def chart(browser, name):
    """The SVG vega-embed drew in chart `name`, once it is there."""
    css = f"#chart-{name} svg.marks"
    WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, css))
    return browser.find_element(By.CSS_SELECTOR, css)


def texts(svg):
    return [t.text for t in svg.find_elements(By.CSS_SELECTOR, "text")]


def count(svg, css):
    return len(svg.find_elements(By.CSS_SELECTOR, css))


@pytest.mark.slow
def test_pass_rate_chart_renders(served, browser):
    browser.get(served.url + "/-/dashboards/casedb")
    svg = chart(browser, "pass-rate-over-runs")
    labels = texts(svg)
    # one line per model, a point per run, runs 1 and 2 on the x axis, the legend names the models
    assert count(svg, ".mark-line.role-mark path") == 2
    assert count(svg, ".mark-symbol.role-mark path") == 4
    assert {"model_a", "model_b", "run", "pass rate (%)", "1", "2"} <= set(labels)
    bars = chart(browser, "failures-by-op")
    assert count(bars, ".mark-rect.role-mark path") == 1
    assert "torch.nn.functional.silu" in texts(bars)
    ARTIFACTS.mkdir(exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / "pass-rate-chart.png"))
    assert (ARTIFACTS / "pass-rate-chart.png").stat().st_size > 10_000


@pytest.mark.slow
def test_pass_rate_chart_of_one_model(served, browser):
    browser.get(served.url + "/-/dashboards/casedb?model=model_b")
    svg = chart(browser, "pass-rate-over-runs")
    assert count(svg, ".mark-line.role-mark path") == 1
    assert count(svg, ".mark-symbol.role-mark path") == 2
    assert "model_b" in texts(svg) and "model_a" not in texts(svg)
    # model_b fails nothing: no bars
    assert count(chart(browser, "failures-by-op"), ".mark-rect.role-mark path") == 0


@pytest.mark.slow
def test_pass_rate_view_links_to_the_chart(served, browser):
    browser.get(served.url + "/casedb/model_pass_rates")
    link = browser.find_element(By.LINK_TEXT, "Chart: pass rate over runs")
    link.click()
    assert chart(browser, "pass-rate-over-runs")
    assert browser.current_url == served.url + "/-/dashboards/casedb"


def test_from_a_failing_cause_to_its_case_run_and_repro(served, browser):
    """Issue 46 item 4, in a browser: the dashboard's axes tick whole numbers, expected failures
    are drawn apart; failures by cause -> every case of the cause -> the failure's page -> its
    case and its run. Screenshots: artifacts/dashboard.png, artifacts/failure-page.png."""
    browser.get(served.url + "/-/dashboards/casedb")
    bars = chart(browser, "failures-by-op")
    ticks = [t.text for t in bars.find_elements(By.CSS_SELECTOR, ".role-axis-label text") if t.text.isdigit()]
    assert ticks == sorted(set(ticks)) == ["0", "1"]  # not "0 1 1"
    outcomes = chart(browser, "outcomes-over-runs")
    assert {"expected failure", "unexpected failure", "passed"} <= set(texts(outcomes))
    ARTIFACTS.mkdir(exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / "dashboard.png"))
    browser.get(served.url + "/casedb/failures_by_cause")
    browser.find_element(By.LINK_TEXT, "1").click()  # the cause's count: every case of it
    assert "/casedb/cause_cases?" in browser.current_url
    browser.find_element(By.PARTIAL_LINK_TEXT, "casedb repro").click()
    assert "/casedb/repro?judgement=" in browser.current_url
    page = browser.find_element(By.TAG_NAME, "body").text
    assert "model_a::a_silu" in page and "failed at 0.5" in page and "run 2 on cpu/inductor" in page
    assert browser.save_screenshot(str(ARTIFACTS / "failure-page.png"))
    browser.find_element(By.LINK_TEXT, "the run").click()
    assert browser.current_url.endswith("/casedb/runs/2")
    browser.back()
    browser.find_element(By.LINK_TEXT, "the case and its inputs").click()
    assert "/casedb/cases/" in browser.current_url and "bf16[1, 11, 5760]" in browser.page_source
