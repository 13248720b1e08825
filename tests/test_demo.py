"""`vit-demo`: the local page for a trained model, driven in a real headless Chromium (Debian's chromium and
chromedriver, through Selenium; nothing downloaded), and its library (vit.inference.demo) without a browser."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]


def photo(path: Path, width: int, height: int, seed: int = 0) -> Path:
    """A photo-like JPEG: smooth colour fields and noise."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
    image = Image.fromarray(small).resize((width, height), Image.BICUBIC)
    noisy = np.clip(np.asarray(image, dtype=np.int16) + rng.integers(-12, 13, (height, width, 3)), 0, 255)
    Image.fromarray(noisy.astype(np.uint8)).save(path, quality=90)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def classify_json(checkpoint: Path, image: Path) -> dict:
    """vit-classify's main() in this process (its command runs as a subprocess in tests/test_classify.py)."""
    from helpers import run_here

    proc = run_here("classify.py", "--checkpoint", checkpoint, image, "--json", "--top-k", "5")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)[0]


def test_the_page_results_are_classifys_and_a_bad_file_is_a_message(trained_checkpoint, tmp_path):
    from vit.inference.demo import analyse, model_card, render
    from vit.inference.classifier import load_classifier

    clf = load_classifier(trained_checkpoint)
    good = photo(tmp_path / "good.jpg", 400, 300)
    (tmp_path / "broken.jpg").write_bytes(good.read_bytes()[:2000])
    bomb = tmp_path / "bomb.png"
    Image.new("L", (12_000, 12_000)).save(bomb)  # 144 MP: over PIL's limit, refused unread
    results = [analyse(clf, p) for p in (good, tmp_path / "broken.jpg", bomb, tmp_path / "missing.png")]
    expected = classify_json(trained_checkpoint, good)["predictions"]
    assert [(p["label"], p["probability"]) for p in expected] == results[0].top
    assert results[0].at_input.shape == (32, 32, 3) and results[0].at_original.shape == (300, 400, 3)
    assert [r.error is not None for r in results] == [False, True, True, True]
    assert "decompression bomb" in results[2].error
    page = render(results)
    assert page.count('class="vit-result') == 4 and page.count("vit-error") == 3
    assert "Test top-1 recorded by its run" in model_card(clf, str(trained_checkpoint))


def test_an_exported_folder_shows_its_recorded_accuracy(trained_checkpoint, tmp_path):
    from vit.commands.export import main as export
    from vit.inference.demo import analyse, recorded_top1
    from vit.inference.classifier import load_classifier

    folder = tmp_path / "exported"
    assert export(["--checkpoint", str(trained_checkpoint), "--output", str(folder), "--format", "timm"]) == 0
    assert "vit-demo --checkpoint local-dir:" in (folder / "README.md").read_text()
    clf = load_classifier(f"local-dir:{folder}")
    good = photo(tmp_path / "good.jpg", 64, 48)
    ours = analyse(clf, good)
    assert ours.top == analyse(load_classifier(trained_checkpoint), good).top
    card = (folder / "README.md").read_text()
    top1 = recorded_top1(f"local-dir:{folder}")
    assert (top1 is None and "not measured" in card) or f"**{top1:.2f} %** test top-1" in card


@pytest.mark.long
def test_without_gradio_or_with_a_bad_checkpoint_it_says_so(tmp_path, monkeypatch, capsys):
    from vit.commands.demo import main

    (tmp_path / "bad.ckpt").write_bytes(b"not a checkpoint")
    assert main(["--checkpoint", str(tmp_path / "bad.ckpt")]) == 2
    assert "not a readable checkpoint" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "gradio", None)  # as where the demo extra is not installed
    assert main(["--checkpoint", str(tmp_path / "bad.ckpt")]) == 2
    assert capsys.readouterr().err.strip() == ("error: vit-demo needs Gradio: make install EXTRAS=demo (or pip install "
                                               "'vit-lightning[demo]')")
    # what the demo extra alone must carry: the page's code needs neither the training stack nor ONNX
    heavy = subprocess.run([sys.executable, "-c", "import sys, vit.commands.demo, vit.inference.demo; print(sorted({m.split('.')[0] "
                            "for m in sys.modules} & {'lightning', 'wandb', 'onnx', 'onnxruntime', 'selenium'}))"],
                           capture_output=True, text=True, timeout=120)
    assert heavy.stdout.strip() == "[]", heavy.stdout + heavy.stderr


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.skip("no Chromium here: `apt-get install chromium chromium-driver` (as root; .ci/run does)")
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1280,1400",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium')}",
                 "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"):  # nothing but this machine
        options.add_argument(flag)
    chrome = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))
    yield chrome
    chrome.quit()


@pytest.fixture(scope="module")
def demo(trained_checkpoint, tmp_path_factory):
    """`python scripts/demo.py` as a user starts it, on a free port."""
    port = free_port()
    log = tmp_path_factory.mktemp("demo") / "demo.log"
    with open(log, "w") as out:
        server = subprocess.Popen([sys.executable, str(ROOT / "scripts/demo.py"), "--checkpoint",
                                   str(trained_checkpoint), "--port", str(port)], stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 300  # (a server that ends meanwhile fails the test at once)
    while True:
        try:
            urllib.request.urlopen(url, timeout=5).close()
            break
        except OSError:
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
    yield url, log
    server.terminate()
    server.wait(timeout=30)


def results(chrome, count: int, timeout: float = 120):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(chrome, timeout).until(
        lambda d: (found := d.find_elements(By.CSS_SELECTOR, "#vit-results .vit-result")) and len(found) == count
        and found)


def upload(chrome, paths: list[Path]) -> None:
    from selenium.webdriver.common.by import By

    chrome.find_element(By.CSS_SELECTOR, "#vit-files input[type=file]").send_keys("\n".join(map(str, paths)))


def test_a_user_drops_images_on_the_page_in_a_real_browser(browser, demo, trained_checkpoint, tmp_path):
    """Upload a photo and a broken file: the top class and its probability are classify's, the broken file
    gets its message beside it; max head fusion changes the overlay. Every resource the page loaded came
    from this machine."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    url, log = demo
    open_page(browser, url)
    good = photo(tmp_path / "good.jpg", 400, 300)
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 64)
    upload(browser, [good, broken])
    shown = results(browser, 2)
    by_name = {r.get_attribute("data-name"): r for r in shown}
    expected = classify_json(trained_checkpoint, good)["predictions"][0]
    top = by_name["good.jpg"]
    assert top.find_element(By.CSS_SELECTOR, ".vit-class").text == expected["label"]
    assert float(top.find_element(By.CSS_SELECTOR, ".vit-prob").text) == pytest.approx(expected["probability"], abs=1e-4)
    assert "cannot be read" in by_name["broken.png"].find_element(By.CSS_SELECTOR, ".vit-message").text
    before = top.find_element(By.CSS_SELECTOR, ".vit-overlay-original").get_attribute("src")
    browser.find_element(By.XPATH, "//*[@id='vit-fusion']//label[normalize-space()='max']").click()
    WebDriverWait(browser, 60).until(lambda d: d.find_element(
        By.CSS_SELECTOR, "#vit-results .vit-result[data-name='good.jpg'] .vit-overlay-original").get_attribute("src")
        != before)
    screenshot = Path(os.environ.get("VIT_DEMO_SCREENSHOT", tmp_path / "demo.png"))
    browser.save_screenshot(str(screenshot))
    assert screenshot.stat().st_size > 10_000
    assert_local_resources(browser)


@pytest.mark.long
def test_twenty_large_photos_dropped_at_once_all_come_back(browser, demo, tmp_path):
    """One 4000×3000 photo, then 20 of them at once, each on a fresh page: every result comes back. (The
    seconds are printed, not bounded: no record measures them.)"""
    url, log = demo
    big = photo(tmp_path / "photo00.jpg", 4000, 3000)
    photos = [big] + [shutil.copy(big, tmp_path / f"photo{i:02d}.jpg") for i in range(1, 20)]
    seconds = {}
    for count in (1, 20):
        open_page(browser, url)
        start = time.monotonic()
        upload(browser, photos[:count])
        shown = results(browser, count, timeout=600)
        seconds[count] = time.monotonic() - start
        assert len(shown) == count and all(result.text.strip() for result in shown)  # each with its answer
        assert_local_resources(browser)
    print(f"one 4000×3000 photo: {seconds[1]:.1f} s; 20 of them: {seconds[20]:.1f} s")


def open_page(browser, url: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(url)
    WebDriverWait(browser, 60).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#vit-files input[type=file]"))


def assert_local_resources(browser) -> None:
    loaded = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert loaded and all(name.startswith(("http://127.0.0.1", "data:", "blob:")) for name in loaded), loaded


def test_the_page_offers_a_folders_examples(trained_checkpoint, tmp_path):
    """`vit-demo --examples DIR`: the page lists DIR's images as examples (built, not served)."""
    import gradio as gr

    from vit.commands.demo import build_page
    from vit.data.images import find_images
    from vit.inference.classifier import load_classifier

    folder = tmp_path / "examples"
    folder.mkdir()
    for i in range(3):
        photo(folder / f"{i}.jpg", 64, 48, seed=i)
    examples = find_images([folder])
    page = build_page(load_classifier(trained_checkpoint), str(trained_checkpoint), examples)
    assert isinstance(page, gr.Blocks)
    (offered,) = [c for c in page.blocks.values() if isinstance(c, gr.Dataset)]  # gr.Examples' table
    assert sorted(Path(row[0][0]).name for row in offered.raw_samples) == ["0.jpg", "1.jpg", "2.jpg"]
