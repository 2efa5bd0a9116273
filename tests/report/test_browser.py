"""report.html in a real browser (headless Chromium via Selenium): every image decodes, the table
script runs, and the console stays free of errors. The checker is itself checked on a deliberately
broken copy, so a page that fails to load images or throws is seen to fail.

Chromium and its driver come from Debian (`chromium`, `chromium-driver`); the session fixture
installs them when missing, since CI starts from a fresh machine and must run this test.
"""
import os
import re
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.browser

PACKAGES = ["chromium", "chromium-driver"]


def _binaries() -> tuple[str | None, str | None]:
    return (
        shutil.which("chromium") or shutil.which("chromium-browser"),
        shutil.which("chromedriver") or (os.path.exists("/usr/bin/chromedriver") and "/usr/bin/chromedriver") or None,
    )


def _apt(prefix: list[str]) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = prefix + ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES]
    if subprocess.run(install, env=env, capture_output=True).returncode != 0:
        # a fresh machine has no package lists yet
        subprocess.run(prefix + ["apt-get", "update"], env=env, check=True, capture_output=True)
        subprocess.run(install, env=env, check=True, capture_output=True)


@pytest.fixture(scope="session")
def chromium() -> tuple[str, str]:
    browser, driver = _binaries()
    if browser and driver:
        return browser, driver
    root = os.geteuid() == 0
    if not root and not shutil.which("apt-get"):
        pytest.skip("headless Chromium is not installed, and it cannot be: not root and no apt-get "
                    f"(install {' '.join(PACKAGES)} to run this test)")
    if not shutil.which("apt-get"):
        pytest.fail(f"Chromium is missing and there is no apt-get to install {' '.join(PACKAGES)}")
    prefix = [] if root else ["sudo", "-n"]
    try:
        _apt(prefix)
    except (subprocess.CalledProcessError, FileNotFoundError) as err:
        stderr = getattr(err, "stderr", b"") or b""
        pytest.fail(f"could not install {' '.join(PACKAGES)} with {' '.join(prefix + ['apt-get'])}: "
                    f"{stderr.decode(errors='replace')[-500:]}")
    browser, driver = _binaries()
    assert browser and driver, "apt-get installed the packages but chromium/chromedriver are not on PATH"
    return browser, driver


@pytest.fixture(scope="session")
def browser(chromium):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = chromium
    options = webdriver.ChromeOptions()
    options.binary_location = binary  # with both paths given, selenium-manager never downloads anything
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--disable-extensions", "--no-first-run", "--window-size=1280,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


IMAGES = """return Array.from(document.images).map(function (im, i) {
  return {index: i, alt: im.alt, complete: im.complete, width: im.naturalWidth};
});"""


def load(driver, path) -> dict:
    """Open the page; -> {"images": [...], "broken": [...], "errors": [...]} after it has loaded."""
    driver.get_log("browser")  # drop what an earlier page logged
    driver.get(path.resolve().as_uri())
    driver.execute_script("return document.readyState")
    images = driver.execute_script(IMAGES)
    broken = [im for im in images if not (im["complete"] and im["width"] > 0)]
    return {"images": images, "broken": broken, "errors": severe(driver)}


def severe(driver) -> list[dict]:
    return [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


def test_report_loads_in_chromium(browser, report):
    got = load(browser, report)
    assert len(got["images"]) >= 8
    assert got["broken"] == [], got["broken"]
    assert got["errors"] == [], got["errors"]
    # the sorting script works: clicking "rank" twice puts the last key head first
    from selenium.webdriver.common.by import By

    header = browser.find_element(By.CSS_SELECTOR, "table.key-heads thead th")
    first = lambda: browser.find_element(By.CSS_SELECTOR, "table.key-heads tbody tr td").text  # noqa: E731
    header.click()
    assert first() == "1"
    header.click()
    assert first() == str(len(browser.find_elements(By.CSS_SELECTOR, "table.key-heads tbody tr")))
    assert severe(browser) == []


def test_checker_sees_a_broken_image_and_a_script_error(browser, report, tmp_path):
    page = report.read_text()
    src = re.search(r'<img[^>]*\ssrc="(data:image/png;base64,[^"]*)"', page).group(1)
    broken = page.replace(src, "data:image/png;base64,iVBORw0KGgoAAAAAAAA", 1)
    broken = broken.replace("</body>", "<script>notDefinedAnywhere();</script></body>")
    path = tmp_path / "broken.html"
    path.write_text(broken)
    got = load(browser, path)
    assert [im["index"] for im in got["broken"]] == [0]
    assert any("notDefinedAnywhere" in e["message"] for e in got["errors"]), got["errors"]


VIEWPORT = 1280  # the width the report must be read at without sideways scrolling of the page

# What sticks out at the right: the page's own scroll width, every table's box, and any element
# that reaches past the viewport without a scrolling table box around it.
WIDTHS = """var vw = window.innerWidth;
function scrolls(box) { return ["auto", "scroll"].indexOf(getComputedStyle(box).overflowX) >= 0; }
function boxed(el) { var b = el.closest(".table-box"); return b !== null && b !== el && scrolls(b); }
function name(el) {
  return el.tagName.toLowerCase() + (el.className ? "." + String(el.className).split(" ").join(".") : "");
}
return {
  inner: vw, scroll: document.documentElement.scrollWidth,
  boxes: Array.from(document.querySelectorAll("table")).map(function (t) {
    var box = t.parentElement, r = box.getBoundingClientRect();
    return {table: t.className, wrapped: box.classList.contains("table-box") && scrolls(box),
            left: r.left, right: r.right,
            scrolls: box.scrollWidth > box.clientWidth};
  }),
  outside: Array.from(document.querySelectorAll("body *")).filter(function (el) {
    var r = el.getBoundingClientRect();
    return !boxed(el) && (r.right > vw + 0.5 || r.left < -0.5);
  }).map(name)
};"""


def widths(driver, path) -> dict:
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": VIEWPORT, "height": 1000, "deviceScaleFactor": 1, "mobile": False})
    driver.get(path.resolve().as_uri())
    driver.execute_script("return document.readyState")
    return driver.execute_script(WIDTHS)


def fits(got: dict) -> list[str]:
    """What is wrong with the page's width, in words (empty when every table fits or scrolls in its box)."""
    wrong = [] if got["scroll"] <= got["inner"] else [f"page scrolls sideways: {got['scroll']} > {got['inner']} px"]
    wrong += [f"table {b['table']} is not in a scrolling box" for b in got["boxes"] if not b["wrapped"]]
    wrong += [f"box of table {b['table']} spans {b['left']:.0f}..{b['right']:.0f} px" for b in got["boxes"]
              if b["left"] < -0.5 or b["right"] > got["inner"] + 0.5]
    return wrong + [f"{el} reaches past the viewport" for el in got["outside"]]


def test_every_table_fits_or_scrolls_in_its_own_box_at_1280px(browser, report):
    got = widths(browser, report)
    assert got["inner"] == VIEWPORT
    assert len(got["boxes"]) >= 10 and "sortable table1" in [b["table"] for b in got["boxes"]]
    assert fits(got) == []


def test_width_checker_sees_a_page_that_runs_off_the_right_edge(browser, report, tmp_path):
    page = report.read_text()
    # table 1 made far wider than the page (a header that cannot wrap): its box scrolls, the page does not
    wide = page.replace("<th>Model</th>", "<th>" + "Model " * 300 + "</th>", 1)
    path = tmp_path / "wide.html"
    path.write_text(wide)
    got = widths(browser, path)
    assert fits(got) == [] and next(b for b in got["boxes"] if b["table"] == "sortable table1")["scrolls"]
    # the same without the scrolling box: the checker must see the overflow
    unboxed = wide.replace("overflow-x:auto", "overflow-x:visible")
    path.write_text(unboxed)
    wrong = fits(widths(browser, path))
    assert any(w.startswith("page scrolls sideways") for w in wrong) and any("reaches past" in w for w in wrong), wrong
