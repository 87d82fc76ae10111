"""Opening a large sweep's report in a headless Chromium: load and draw times, and its bytes.

    python benchmarks/report_open.py [--dir DIR] [--points 200] [--ranks 8] [--iterations 200] [--repeat 3]

DIR's point files are analysis_scale.py's (made by it in a child when DIR holds none, with
--ranks and --iterations for its large point and --points for the sweep of 1..128 ranks),
then `hpcbench report DIR` writes report.html. Each of --repeat fresh Chromium processes
(Debian's `chromium`, driven as tests/analysis/test_report.py drives it) opens the page and
the script prints: load ms (navigation start to the end of the load event, by the page's own
clock), drawn ms (to the last figure drawn), each with the CPU ms the page's main thread ran
by then (the figure a loaded machine moves least), the figures drawn, requests for anything but the
page and data: URLs, and the load average. Goal: <= 2 s to load, under 10 MB.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.analysis.browser

from tests.analysis.browser import find_chromium, open_page  # noqa: E402

DRAWN = "new Promise(r => { const t = () => (window.reportDrawn ? r(window.reportDrawn) : setTimeout(t, 50)); t(); })"
FIGURES = (
    "document.querySelectorAll('div.plot .main-svg').length > 0 ? document.querySelectorAll('div.plot').length : 0"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, help="the sweep (analysis_scale.py's point files made when missing)")
    ap.add_argument("--points", type=int, default=200)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3, help="fresh Chromium processes")
    args = ap.parse_args()
    binary = find_chromium()
    if binary is None:
        sys.exit("needs Debian's chromium (apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="hpcbench-report-") as tmp:
        directory = args.dir or Path(tmp)
        if not any(directory.glob("*.h5")):
            scale = str(ROOT / "benchmarks" / "analysis_scale.py")
            argv = [sys.executable, scale, "--generate", str(directory), "--ranks", str(args.ranks),
                    "--iterations", str(args.iterations), "--points", str(args.points)]  # fmt: skip
            subprocess.run(argv, check=True)
        subprocess.run([sys.executable, "-m", "hpcbench.analyze", "report", str(directory)], check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        page = directory / "report.html"
        print(f"{page}: {page.stat().st_size / 1e6:.2f} MB")
        for _ in range(args.repeat):
            result = open_page(page, binary, {"drawn": DRAWN, "figures": FIGURES})
            outside = [u for u in result.requests if not u.startswith(("file:", "data:"))]
            cpu = result.cpu_s
            print(f"load {result.load_ms:.0f} ms (main thread CPU {cpu['load'] * 1e3:.0f} ms), every figure drawn "
                  f"{result.values['drawn']:.0f} ms (CPU {cpu['checks'] * 1e3:.0f} ms), "
                  f"{result.values['figures']} figures, errors {len(result.errors)}, requests outside {outside}, "
                  f"load average {os.getloadavg()[0]:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
