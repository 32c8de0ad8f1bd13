"""Render a normlab report (report.html of a compare or of a ladder) in headless Chromium, check
it in the page and save a full-page screenshot.

    python scripts/report_screenshot.py OUT/report.html [--png OUT/report.png] [--width 1280]

Two Chromium runs, each with a fresh profile in a temporary folder and nothing fetched from the
network (the report is self-contained):

1. a copy of the page with a checking script added at its end is loaded and its DOM dumped
   (``--dump-dom``); once the page has loaded, the script records in the DOM every image's
   ``complete`` and ``naturalWidth`` (an image that did not load or decode has width 0), the
   box of every visible piece of text (each line of each text node, from the layout itself)
   and every two boxes of different text that overlap by more than a pixel each way, the
   tables wider than the page's column (they scroll sideways: noted, not a failure), and the
   page's size;
2. the page itself is captured at the dumped height (``--screenshot``, one window as tall as
   the page) to ``--png``.

Exit status 0 when every image loaded and no two text boxes overlap, 1 otherwise (each problem
printed), 2 when Chromium is missing or fails. Chromium is the Debian package ``chromium``
(``apt-get install chromium``); ``--chromium`` names another binary. The test suite does not
need it: tests/compare/test_ladder_report.py checks the same page's content without a browser.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",
)
"""Chromium's flags for both runs: headless, no sandbox (root in a container), nothing fetched
or updated in the background."""

MARK = "normlab-check"
"""The id of the element the checking script writes its findings into."""

CHECK_JS = """
<script>
window.addEventListener("load", () => {
  const found = {images: [], overlaps: [], texts: 0};
  for (const img of document.images) {
    found.images.push({alt: img.alt, complete: img.complete, width: img.naturalWidth,
                       height: img.naturalHeight});
  }
  const boxes = [];
  const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walk.nextNode(), k = 0; node; node = walk.nextNode(), k++) {
    const text = node.textContent.trim();
    const style = node.parentElement ? getComputedStyle(node.parentElement) : null;
    if (!text || !style || style.visibility === "hidden" || style.display === "none") continue;
    const range = document.createRange();
    range.selectNodeContents(node);
    for (const r of range.getClientRects()) {
      if (r.width > 0 && r.height > 0) {
        boxes.push({node: k, text: text.slice(0, 50), x0: r.left + scrollX, x1: r.right + scrollX,
                    y0: r.top + scrollY, y1: r.bottom + scrollY});
      }
    }
  }
  found.texts = boxes.length;
  boxes.sort((a, b) => a.y0 - b.y0);
  for (let i = 0; i < boxes.length; i++) {
    const a = boxes[i];
    for (let j = i + 1; j < boxes.length && boxes[j].y0 < a.y1 - 1; j++) {
      const b = boxes[j];
      if (a.node === b.node) continue;
      const w = Math.min(a.x1, b.x1) - Math.max(a.x0, b.x0);
      const h = Math.min(a.y1, b.y1) - Math.max(a.y0, b.y0);
      if (w > 1 && h > 1) found.overlaps.push([a.text, b.text, Math.round(w), Math.round(h)]);
    }
  }
  found.scrolled = [];
  for (const el of document.querySelectorAll(".table-wrap")) {
    if (el.scrollWidth > el.clientWidth + 1) {
      found.scrolled.push([(el.querySelector("th") || el).textContent.slice(0, 50),
                           el.scrollWidth, el.clientWidth]);
    }
  }
  const root = document.documentElement;
  found.height = root.scrollHeight;
  found.width = root.scrollWidth;
  found.viewport = window.innerWidth;
  const out = document.createElement("pre");
  out.id = "__MARK__";
  out.textContent = JSON.stringify(found);
  document.body.appendChild(out);
});
</script>
""".replace("__MARK__", MARK)


def _chromium(binary: str, profile: Path, *args: str, timeout: float = 120.0) -> str:
    """Run Chromium with :data:`FLAGS`, a fresh ``profile`` and ``args``; its stdout."""
    cmd = [binary, *FLAGS, f"--user-data-dir={profile}", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"chromium exited with {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def check_page(page: Path, binary: str, width: int, tmp: Path) -> dict:
    """The checking script's findings for ``page`` in a ``width``-pixel-wide window."""
    text = page.read_text(encoding="utf-8")
    checked = tmp / "checked.html"
    at = text.rfind("</body>")
    checked.write_text(
        text[:at] + CHECK_JS + text[at:] if at >= 0 else text + CHECK_JS, encoding="utf-8"
    )
    dom = _chromium(
        binary,
        tmp / "profile-check",
        f"--window-size={width},1000",
        "--virtual-time-budget=20000",
        "--dump-dom",
        checked.as_uri(),
    )
    match = re.search(rf'<pre id="{MARK}">(.*?)</pre>', dom, re.S)
    if match is None:
        raise RuntimeError("the checking script wrote nothing: the page did not finish loading")
    return json.loads(html.unescape(match.group(1)))


def problems(found: dict) -> list[str]:
    """Each image that did not load and each pair of overlapping text boxes, in words."""
    out = [
        f"image {img['alt']!r} did not load (complete {img['complete']}, width {img['width']})"
        for img in found["images"]
        if not img["complete"] or img["width"] <= 0
    ]
    out += [f"text overlaps: {a!r} and {b!r} ({w}×{h} px)" for a, b, w, h in found["overlaps"]]
    if found["width"] > found["viewport"]:
        out.append(f"the page is {found['width']} px wide in a {found['viewport']} px window")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("page", type=Path, help="a report.html")
    parser.add_argument("--png", type=Path, help="the screenshot (default: PAGE with .png)")
    parser.add_argument("--width", type=int, default=1280, help="window width in pixels")
    parser.add_argument("--chromium", default="chromium", help="the Chromium binary")
    args = parser.parse_args(argv)
    binary = shutil.which(args.chromium)
    if binary is None:
        print(f"--chromium: {args.chromium!r} not found; install Debian's chromium package")
        return 2
    page = args.page.resolve()
    png = (args.png or page.with_suffix(".png")).resolve()
    with tempfile.TemporaryDirectory(prefix="normlab-shot-") as d:
        try:
            found = check_page(page, binary, args.width, Path(d))
            height = min(int(found["height"]) + 20, 30000)
            _chromium(
                binary,
                Path(d) / "profile-shot",
                f"--window-size={args.width},{height}",
                f"--screenshot={png}",
                page.as_uri(),
            )
        except (RuntimeError, subprocess.TimeoutExpired) as err:
            print(f"chromium: {err}")
            return 2
    wrong = problems(found)
    print(
        f"{page}: {len(found['images'])} images, {found['texts']} text boxes, page "
        f"{found['width']}×{found['height']} px; screenshot {png}"
    )
    for head, full, shown in found["scrolled"]:
        print(f"  note: the table starting {head!r} scrolls sideways ({full} px in {shown} px)")
    for line in wrong:
        print(f"  {line}")
    print("no overlapping text, every image loaded" if not wrong else f"{len(wrong)} problem(s)")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
