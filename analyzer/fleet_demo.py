"""``diagnose demo --fleet``: four demo replicas, a real Prometheus scraping them, then ``diagnose fleet``.

Replicas (``diagnose.examples.fleet.DEMO_FLEET``): two ``queueing`` services, one ``prefill``, one ``healthy``
whose GPU is a replayed real dcgm-exporter scrape of a power-capped Tesla T4. Prometheus (the
Debian package's binary) scrapes them every second on 127.0.0.1; after the window, the fleet is
judged from Prometheus alone, exactly as ``diagnose fleet --prometheus URL`` would. Everything started
here is stopped on the way out, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import sys
import threading

from diagnose.errors import DiagnoseError
from diagnose.output import DOCUMENT

MIN_WINDOW_S = 30.0  # a fleet window shorter than this holds too few scrapes for the histogram deltas


def run(args: argparse.Namespace) -> int:
    from diagnose import fleet
    from diagnose.demo import require_demo_extra
    from diagnose.examples.fleet import DEMO_FLEET, INSTALL_HINT, DemoFleet, find_prometheus

    require_demo_extra()
    if find_prometheus() is None:
        raise DiagnoseError("the fleet demo needs Prometheus, and no prometheus binary was found.", INSTALL_HINT)
    window = max(MIN_WINDOW_S, float(args.duration))
    names = ", ".join(f"{s.pod} {s.pathology}" + (" + replayed T4 GPU" if s.gpu_scrape else "") for s in DEMO_FLEET)
    try:
        with DemoFleet(load_s=window + 120.0) as demo:
            assert demo.prometheus is not None
            print(f"demo: started {len(DEMO_FLEET)} replicas ({names}) and Prometheus at {demo.prometheus.url} "
                  "scraping them every second; driving load", file=sys.stderr)
            demo.prometheus.wait_for_targets()
            print(f"demo: letting Prometheus record {window:.0f} s of the fleet", file=sys.stderr)
            threading.Event().wait(window)
            doc = fleet.run(fleet.FleetOptions(url=demo.prometheus.url, window_s=window, by=("pod",)))
    except FileNotFoundError as exc:
        raise DiagnoseError(str(exc).split(". ")[0] + ".", INSTALL_HINT) from exc
    except RuntimeError as exc:
        raise DiagnoseError(f"the fleet demo could not start ({str(exc)[:300]}).",
                            "Run `make venv` and check that nothing else holds the CPU.") from exc
    DOCUMENT.write(args.format, doc)
    print("demo: on your own fleet: diagnose fleet --prometheus http://PROMETHEUS:9090 --selector '{job=\"vllm\"}' "
          "(--format html -o fleet.html for one file; diagnose dashboard fleet.json for the Fleet page)",
          file=sys.stderr)
    return 0
