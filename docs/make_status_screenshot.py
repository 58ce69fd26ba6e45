"""Makes docs/status-page.png: a real `qbridge run --listen` on the local PostgreSQL, fed by a
writer at a varying rate for a few minutes (with a few rows it cannot read), photographed in
Debian's headless Chromium.

    python3 docs/make_status_screenshot.py               # 5 minutes
    python3 docs/make_status_screenshot.py --minutes 2
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import sqlalchemy as sa

from bridge.demo.run import MAPPING
from bridge.demo.samples import create_nginn_queue, nginn_row

PG = os.environ.get("QBRIDGE_BENCH_PG_URL", "postgresql+psycopg://127.0.0.1/test")
SCHEMA, NSB = "qstatus_legacy", "qstatus_nsb"
TZ = "Europe/Warsaw"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=5)
    ap.add_argument("--out", default=str(Path(__file__).with_name("status-page.png")))
    args = ap.parse_args()

    engine = sa.create_engine(PG)
    with engine.begin() as conn:
        for schema in (SCHEMA, NSB):
            conn.execute(sa.text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
            conn.execute(sa.text(f"CREATE SCHEMA {schema}"))
    tables = {q: create_nginn_queue(engine, q, SCHEMA) for q in ("Orders", "Billing")}
    tmp = Path(tempfile.mkdtemp())
    (tmp / "mapping.toml").write_text(MAPPING.replace('"MQueue1" = "Orders"', '"Orders" = "Orders"')
                                      .replace('"MQueue2" = "Billing"', '"Billing" = "Billing"'))
    config = tmp / "shop-bridge.toml"
    config.write_text(f"""
[connections]
legacy = "{PG}"
nsb    = "{PG}"

[[jobs]]
name     = "shop-orders"
source   = {{ system = "nginn", connection = "legacy", queues = ["Orders", "Billing"], timezone = "{TZ}", schema = "{SCHEMA}", database = "Shop" }}
target   = {{ connection = "nsb", flavor = "postgresql", schema = "{NSB}" }}
mapping  = "mapping.toml"
mode     = "move"
schedule = {{ every = "2s" }}
""")
    subprocess.run([sys.executable, "-m", "bridge", "init", "-c", str(config)], check=True, capture_output=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp / "run.log", "wb")
    run = subprocess.Popen([sys.executable, "-m", "bridge", "run", "-c", str(config), "--listen", f"127.0.0.1:{port}"],
                           stderr=log)
    try:
        start, n = time.monotonic(), 0
        while time.monotonic() - start < args.minutes * 60:
            minute = (time.monotonic() - start) / 60
            rate = int(40 + 30 * math.sin(minute * 2))  # messages per 2 s: a load that comes and goes
            now = datetime.now(ZoneInfo(TZ)).replace(tzinfo=None, microsecond=0)
            rows = {"Orders": [], "Billing": []}
            for _ in range(rate):
                n += 1
                queue = "Orders" if n % 3 else "Billing"
                row = nginn_row(queue, n, now, headers="Tenant=acme")
                if n in (117, 731):
                    row["msg_text"] = '{"$type": "Orders.PlaceOrder, Orders", "OrderId": 7,'  # cut off mid-write
                rows[queue].append(row)
            with engine.begin() as conn:
                for queue, batch in rows.items():
                    if batch:
                        conn.execute(tables[queue].insert(), batch)
            time.sleep(2)
        time.sleep(4)
        shoot(f"http://127.0.0.1:{port}/", args.out)
    finally:
        run.send_signal(signal.SIGTERM)
        run.wait(60)
        with engine.begin() as conn:
            for schema in (SCHEMA, NSB):
                conn.execute(sa.text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
    print(f"wrote {args.out}; qbridge run's log: {tmp / 'run.log'}")
    return 0


def shoot(url: str, out: str) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,900", "--hide-scrollbars"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path="/usr/bin/chromedriver"))
    try:
        driver.get(url)
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                               {"width": 1200, "height": height + 20, "deviceScaleFactor": 1, "mobile": False})
        driver.save_screenshot(out)
    finally:
        driver.quit()


if __name__ == "__main__":
    sys.exit(main())
